"""The rig's vocabulary: the arms, an arm's configuration, a worker process, and one logged
fault. Kept apart from the controller so the fault arms and the checks can name them without
importing the controller."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.support.fault_proxy import FaultProxy

ARMS = (
    "kill_after_effect",
    "kill_after_commit",
    "zombie",
    "kill_during_takeover",
    "postgres_restart",
    "redis_restart",
    "sigterm_drain",
    "commit_no_reply",
    "clock_skew",
    "lease_store_outage",
)


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    node: str
    log: Path
    ready_at: float = 0.0
    #: Seconds its wall clock is off (libfaketime), for ``clock_skew``.
    skew: float = 0.0
    #: The fault proxy its journal connections go through, for ``commit_no_reply``.
    proxy: FaultProxy | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Fault:
    kind: str
    at: float
    pid: int | None = None
    node: str | None = None
    #: Instances whose lease the faulted worker held when the fault landed.
    affected: list[str] = field(default_factory=list)
    #: For server restarts: when the server was back.
    until: float | None = None
    #: The instance parked at the point the fault was aimed at, if any.
    parked: dict[str, Any] | None = None


@dataclass
class RigConfig:
    arm: str
    flows: int = 500
    workers: int = 3
    ttl: float = 3.0
    scan: float = 1.0
    faults: int = 3
    rate: float = 200.0
    work_ms: tuple[int, int] = (20, 80)
    redis_leases: bool = False
    drain_timeout: float = 10.0
    #: How long a restarted server stays down; ``None``: a second for PostgreSQL, and a whole
    #: TTL for Redis (so every lease runs out and is taken again from a Redis that forgot),
    #: 3 × TTL for ``lease_store_outage``.
    outage: float | None = None
    #: Per worker slot (cycled), how far its wall clock is off, in seconds (``clock_skew``).
    skews: tuple[float, ...] = ()
    settle_timeout: float = 300.0
