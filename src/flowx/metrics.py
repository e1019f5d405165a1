"""Counters an operator alerts on, exported through prometheus-client when it is installed.

``flowx[prometheus]`` brings the library; without it the counters still count in-process (so
tests and ``flowx`` tooling can read them) and nothing is exported. Nothing here is on the
step-commit hot path.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

_prometheus: Any
try:  # optional: flowx[prometheus]
    import prometheus_client as _prometheus
except ImportError:  # pragma: no cover - exercised only without the extra
    _prometheus = None


class _LabelledCounter:
    def __init__(self, name: str, documentation: str, label: str) -> None:
        self.name = name
        self._label = label
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._exported: Any = None
        if _prometheus is not None:
            try:
                self._exported = _prometheus.Counter(name, documentation, [label])
            except ValueError:  # already registered (a module reloaded in tests)
                self._exported = None

    def inc(self, value: str) -> None:
        with self._lock:
            self._counts[value] += 1
        if self._exported is not None:
            self._exported.labels(value).inc()

    def get(self, value: str) -> int:
        with self._lock:
            return self._counts[value]


#: Raised once per instance that ran out of compensation attempts (SPEC §8), by flow id.
COMPENSATION_FAILED = _LabelledCounter(
    "flowx_compensation_failed",
    "Instances that ended CompensationFailed: a compensation ran out of attempts",
    "flow",
)
#: Instances that passed their flow deadline and were moved to TimedOut, by flow id.
DEADLINE_EXCEEDED = _LabelledCounter(
    "flowx_deadline_exceeded", "Instances that passed their flow deadline", "flow"
)


class _LabelledGauge:
    def __init__(self, name: str, documentation: str, label: str) -> None:
        self.name = name
        self._values: dict[str, float] = {}
        self._lock = threading.Lock()
        self._exported: Any = None
        if _prometheus is not None:
            try:
                self._exported = _prometheus.Gauge(name, documentation, [label])
            except ValueError:  # already registered (a module reloaded in tests)
                self._exported = None

    def set(self, value: str, amount: float) -> None:
        with self._lock:
            self._values[value] = amount
        if self._exported is not None:
            self._exported.labels(value).set(amount)

    def get(self, value: str) -> float | None:
        with self._lock:
            return self._values.get(value)


#: How far ahead of this node's clock each store's clock is, in seconds (R9.2), by store.
CLOCK_OFFSET = _LabelledGauge(
    "flowx_clock_offset_seconds",
    "Offset of a store's clock to this node's (positive: the store is ahead)",
    "store",
)
#: Capability threads inside a call their step gave up on (a timeout, a drain), by node: a
#: thread cannot be killed, so it is counted until it returns (issue 12 item 4).
CAPABILITY_THREADS_STUCK = _LabelledGauge(
    "flowx_capability_threads_stuck",
    "Capability threads stuck in a call their step abandoned",
    "node",
)
