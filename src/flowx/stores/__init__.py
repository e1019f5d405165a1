"""Stores: the protocols every backend implements, their errors, and the backends."""

from flowx.stores.errors import (
    DuplicateStep,
    FencedOut,
    JournalUnavailable,
    LeaseLost,
    LeaseUnavailable,
    NotAFlowXStore,
    SchemaTooNew,
    StoreError,
    UnknownInstance,
)
from flowx.stores.protocols import (
    FlowJournal,
    InstanceCatalog,
    InstanceQuery,
    LeaseStore,
    RecoveryIndex,
    Stores,
)

__all__ = [
    "DuplicateStep",
    "FencedOut",
    "FlowJournal",
    "InstanceCatalog",
    "InstanceQuery",
    "JournalUnavailable",
    "LeaseLost",
    "LeaseStore",
    "LeaseUnavailable",
    "NotAFlowXStore",
    "RecoveryIndex",
    "SchemaTooNew",
    "StoreError",
    "Stores",
    "UnknownInstance",
]
