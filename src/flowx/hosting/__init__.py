"""Hosting: the node that wires stores into the engine, leases, recovery, timers, workers."""

from flowx.engine.replay_plan import ReplayPlan
from flowx.hosting.alerts import AlertSink, LoggingAlertSink, RecordingAlertSink
from flowx.hosting.archive import Archiver, JsonlArchiver, read_archive
from flowx.hosting.host import FlowHandle, FlowHost
from flowx.hosting.lease import DurableLease
from flowx.hosting.recovery import RecoveryScanResult, RecoveryService
from flowx.hosting.retention import SweepReport
from flowx.hosting.settings import HostSettings
from flowx.hosting.stopping import StopOutcome
from flowx.hosting.stores import (
    from_url,
    memory,
    postgres,
    redis_leases,
    sharded,
    sqlite,
    with_leases,
)
from flowx.hosting.timers import TimerService, TimerSweep

__all__ = [
    "AlertSink",
    "Archiver",
    "DurableLease",
    "FlowHandle",
    "FlowHost",
    "HostSettings",
    "JsonlArchiver",
    "LoggingAlertSink",
    "RecordingAlertSink",
    "RecoveryScanResult",
    "RecoveryService",
    "ReplayPlan",
    "StopOutcome",
    "SweepReport",
    "TimerService",
    "TimerSweep",
    "from_url",
    "memory",
    "postgres",
    "read_archive",
    "redis_leases",
    "sharded",
    "sqlite",
    "with_leases",
]
