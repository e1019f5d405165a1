"""A journal sharded by tenant over several PostgreSQL primaries (R6.2, R9.9)."""

from flowx.stores.sharded.store import ShardedStores

__all__ = ["ShardedStores"]
