"""The in-memory store: exists to make engine tests fast, held to the same conformance suite."""

from flowx.stores.memory.store import MemoryStores

__all__ = ["MemoryStores"]
