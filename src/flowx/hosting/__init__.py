"""Hosting: the node that wires stores into the engine, leases, recovery, workers."""

from flowx.hosting.host import FlowHandle, FlowHost
from flowx.hosting.lease import DurableLease
from flowx.hosting.recovery import RecoveryScanResult, RecoveryService
from flowx.hosting.settings import HostSettings
from flowx.hosting.stores import from_url, memory, postgres, redis_leases, sqlite, with_leases

__all__ = [
    "DurableLease",
    "FlowHandle",
    "FlowHost",
    "HostSettings",
    "RecoveryScanResult",
    "RecoveryService",
    "from_url",
    "memory",
    "postgres",
    "redis_leases",
    "sqlite",
    "with_leases",
]
