"""What a FlowX process measures, exported through prometheus-client when it is installed.

``flowx-runtime[prometheus]`` brings the library, and ``flowx worker --metrics-port`` serves the
families below on ``/metrics``. Without it every family still counts in-process (so tests and
``flowx`` tooling can read them) and nothing is exported.

Each family is fed at one seam, never from inside the engine: step commits where a node's
commits reach the journal (``hosting/ports.py``), flow outcomes where a run's result is
handled (``hosting/outcomes.py``), takeovers and timer lateness where an instance is taken
over (``InstanceRunner.resume``), sweeps where their reports are made, and the sampled
gauges (outbox, leases, journal up) by the worker's sampler (``hosting/sampling.py``).
Families are process-wide, as Prometheus expects: several hosts in one process (tests) add
to the same series, told apart where it matters by a ``node`` label.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

_prometheus: Any
_Counters: Any
_Histograms: Any
_bound_text: Any
_Sample: Any
try:  # optional: flowx-runtime[prometheus]
    import prometheus_client as _prometheus
    from prometheus_client.core import CounterMetricFamily as _Counters
    from prometheus_client.core import HistogramMetricFamily as _Histograms
    from prometheus_client.samples import Sample as _Sample
    from prometheus_client.utils import floatToGoString as _bound_text
except ImportError:  # pragma: no cover - exercised only without the extra
    _prometheus = None

#: Latency buckets for a step commit (seconds): group commit puts most under 10 ms.
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: Buckets for delays an operator watches in seconds to minutes (takeovers, timer lateness).
DELAY_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

Labels = str | tuple[str, ...]
C = TypeVar("C")


def _key(labels: Labels) -> tuple[str, ...]:
    return labels if isinstance(labels, tuple) else (labels,)


def _export(kind: str, name: str, documentation: str, labels: Sequence[str], **kw: Any) -> Any:
    """The prometheus-client family, or ``None`` without the library (or when the name is
    taken already: a module reloaded in tests keeps counting in-process)."""
    if _prometheus is None:
        return None
    try:
        return getattr(_prometheus, kind)(name, documentation, list(labels), **kw)
    except ValueError:
        return None


def _series(family: Any, key: tuple[str, ...]) -> Any:
    """The exported series of ``key`` (a family without labels is its own only series)."""
    if family is None:
        return None
    return family.labels(*key) if key else family


class _CounterChild:
    """One series of a counter, bound once and kept by a hot caller: an increment is an
    attribute add. Fed from the event loop's thread only (every seam is); the exporter reads
    it when scraped (``_Collector``)."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0
        #: When the series began (the exported ``_created`` sample): a scraper tells a reset
        #: from a restart by it.
        self.created = time.time()

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class _Family(Generic[C]):
    """Series by label values, each bound once (``child``) and kept by hot callers."""

    def __init__(
        self, name: str, documentation: str, labels: Sequence[str], make: Callable[[], C]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = tuple(labels)
        self._children: dict[tuple[str, ...], C] = {}
        self._lock = threading.Lock()
        self._make = make
        if not self.labels:  # its own only series, served (as 0) before anything counts
            self.child(())
        _FAMILIES.append(self)

    def child(self, labels: Labels) -> C:
        """The series for ``labels``, to keep and use directly."""
        key = _key(labels)
        found = self._children.get(key)
        if found is None:
            with self._lock:
                found = self._children.get(key)
                if found is None:
                    if len(key) != len(self.labels):
                        raise ValueError(
                            f"{self.name} has labels {self.labels}, not the values {key!r}"
                        )
                    found = self._children[key] = self._make()
        return found

    def series(self) -> list[tuple[tuple[str, ...], C]]:
        """Every series so far, for the exporter's thread (a copy: the loop may add one)."""
        with self._lock:
            return list(self._children.items())

    def _found(self, labels: Labels) -> C | None:
        return self._children.get(_key(labels))


#: Every counter and histogram family, in the order they were made (``_Collector``).
_FAMILIES: list[_Family[Any]] = []


class _LabelledCounter(_Family[_CounterChild]):
    """A counter by label values; ``inc("a")`` for one label, ``inc(("a", "b"))`` for two."""

    def __init__(self, name: str, documentation: str, *labels: str) -> None:
        super().__init__(name, documentation, labels, _CounterChild)

    def inc(self, labels: Labels, amount: int = 1) -> None:
        self.child(labels).inc(amount)

    def get(self, labels: Labels) -> int:
        found = self._found(labels)
        return found.value if found is not None else 0


class _LabelledGauge:
    """A gauge by label values: the last value set."""

    def __init__(self, name: str, documentation: str, *labels: str) -> None:
        self.name = name
        self._values: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()
        self._exported = _export("Gauge", name, documentation, labels)

    def set(self, labels: Labels, amount: float) -> None:
        key = _key(labels)
        with self._lock:
            self._values[key] = amount
        if self._exported is not None:
            _series(self._exported, key).set(amount)

    def get(self, labels: Labels) -> float | None:
        with self._lock:
            return self._values.get(_key(labels))


class _HistogramChild:
    """One series of a histogram, bound once (see ``_CounterChild``): its count, its sum and
    how many observations fell in each bucket (the last: above every bound)."""

    __slots__ = ("_bounds", "buckets", "count", "created", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.created = time.time()
        self.count = 0
        self.total = 0.0
        self._bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)

    def observe(self, value: float) -> None:
        self.count += 1
        self.total += value
        # A bucket holds what is at most its bound (Prometheus's ``le``).
        self.buckets[bisect.bisect_left(self._bounds, value)] += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """Each bound (the last: infinity) with how many observations were at most it."""
        running, out = 0, []
        for bound, n in zip((*self._bounds, math.inf), list(self.buckets), strict=True):
            running += n
            out.append((bound, running))
        return out


class _LabelledHistogram(_Family[_HistogramChild]):
    """A histogram by label values; in-process it keeps the count, the sum and the buckets."""

    def __init__(
        self, name: str, documentation: str, *labels: str, buckets: Sequence[float]
    ) -> None:
        self.bounds = tuple(sorted(buckets))
        super().__init__(name, documentation, labels, lambda: _HistogramChild(self.bounds))

    def observe(self, labels: Labels, value: float) -> None:
        self.child(labels).observe(value)

    def count(self, labels: Labels) -> int:
        found = self._found(labels)
        return found.count if found is not None else 0


class _Collector:
    """Exports the counters and histograms as they are when scraped, read from their
    in-process series: a step commit pays a few attribute adds and a bisect, not
    prometheus-client's locked series (about a twentieth of the engine's CPU per flow in a
    sampled profile, issue 14). The samples are those prometheus-client's own series give,
    ``_created`` included."""

    def describe(self) -> list[Any]:
        return [self._empty(f) for f in _FAMILIES]

    def collect(self) -> list[Any]:
        # prometheus-client's own switch (``disable_created_metrics`` or the environment's
        # PROMETHEUS_DISABLE_CREATED_SERIES), read as its own series read it.
        created = getattr(_prometheus.metrics, "_use_created", True)
        out = []
        for family in list(_FAMILIES):
            exported = self._empty(family)
            for key, child in family.series():
                values = [str(v) for v in key]  # as prometheus-client's ``labels`` made them
                if isinstance(child, _HistogramChild):
                    buckets = [(_bound_text(le), n) for le, n in child.cumulative()]
                    exported.add_metric(values, buckets, child.total)
                    if created:  # ``HistogramMetricFamily`` takes no ``created``: its sample
                        labels = dict(zip(family.labels, values, strict=True))
                        exported.samples.append(
                            _Sample(f"{family.name}_created", labels, child.created)
                        )
                else:
                    exported.add_metric(
                        values, child.value, created=child.created if created else None
                    )
            out.append(exported)
        return out

    @staticmethod
    def _empty(family: _Family[Any]) -> Any:
        kind = _Histograms if isinstance(family, _LabelledHistogram) else _Counters
        return kind(family.name, family.documentation, labels=list(family.labels))


# -- alerts ----------------------------------------------------------------------------------

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

# -- the journal's hot path (one observation per commit) -------------------------------------

#: Step rows committed, by flow and outcome (Success, Failure, Compensated, …).
STEP_COMMITS = _LabelledCounter(
    "flowx_step_commits", "Step rows committed to the journal", "flow", "outcome"
)
#: How long a commit took from this node's call to the journal's answer (group commit
#: included), by flow.
STEP_COMMIT_SECONDS = _LabelledHistogram(
    "flowx_step_commit_seconds",
    "Latency of a step commit, from the call to the journal's answer",
    "flow",
    buckets=COMMIT_BUCKETS,
)

# -- outcomes and takeovers ------------------------------------------------------------------

#: Runs of instances that ended, by flow and how (completed, failed, timed_out, …).
FLOWS_ENDED = _LabelledCounter(
    "flowx_flows_ended", "Instances that ended, by how they ended", "flow", "outcome"
)
#: Instances taken over from a node that stopped renewing its lease (a crash, a partition).
TAKEOVERS = _LabelledCounter(
    "flowx_takeovers", "Instances taken over after their node's lease expired", "flow"
)
#: How long a taken-over instance sat since its last write before this node resumed it.
TAKEOVER_DELAY_SECONDS = _LabelledHistogram(
    "flowx_takeover_delay_seconds",
    "Time from an instance's last write to its takeover by another node",
    "flow",
    buckets=DELAY_BUCKETS,
)
#: How late a durable timer (a sleep, a wait's timeout, a deadline) was when it woke.
TIMER_LATENESS_SECONDS = _LabelledHistogram(
    "flowx_timer_lateness_seconds",
    "Time from a timer's due moment to the takeover that ran it",
    "flow",
    buckets=DELAY_BUCKETS,
)
#: Recovery sweeps, and the instances they resumed (queued or abandoned).
RECOVERY_SWEEPS = _LabelledCounter("flowx_recovery_sweeps", "Recovery sweeps run")
RECOVERY_RESUMED = _LabelledCounter(
    "flowx_recovery_resumed", "Instances a recovery sweep resumed (queued or abandoned)"
)

# -- broker ingress --------------------------------------------------------------------------

#: Broker messages an ingress handled, by outcome: started, duplicate (a redelivered start),
#: signalled, dead (dead-lettered) or retry (left for the broker to redeliver).
INGRESS_MESSAGES = _LabelledCounter(
    "flowx_ingress_messages", "Broker messages handled by ingress, by outcome", "outcome"
)

# -- retention -------------------------------------------------------------------------------

#: Instances deleted by retention sweeps (archived first when an archiver is set).
RETENTION_DELETED = _LabelledCounter(
    "flowx_retention_deleted", "Ended instances a retention sweep deleted"
)
#: Expired instances the last sweep kept, by why (unpublished events, unread, parent running).
RETENTION_HELD_BACK = _LabelledGauge(
    "flowx_retention_held_back", "Expired instances the last retention sweep kept", "reason"
)

# -- sampled: what the worker's sampler reads every few seconds ----------------------------

#: Instances running on this node now.
IN_FLIGHT = _LabelledGauge("flowx_instances_in_flight", "Instances running on this node", "node")
#: Leases this node holds now.
LEASES_HELD = _LabelledGauge("flowx_leases_held", "Instance leases this node holds", "node")
#: 1 while this node's journal answers, 0 while it does not.
JOURNAL_UP = _LabelledGauge("flowx_journal_up", "1 while the journal answers this node", "node")
#: Outbox events staged and not yet published, their oldest's age, dead letters: facts of
#: the journal, the same read from every node, so without a node label (``max`` them).
OUTBOX_PENDING = _LabelledGauge("flowx_outbox_pending", "Outbox events not yet published")
OUTBOX_LAG_SECONDS = _LabelledGauge(
    "flowx_outbox_lag_seconds", "Age of the oldest unpublished outbox event"
)
OUTBOX_DEAD_LETTERS = _LabelledGauge(
    "flowx_outbox_dead_letters", "Outbox events the broker refused for good"
)

# -- this node -------------------------------------------------------------------------------

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


if _prometheus is not None:
    # One collector for every counter and histogram. A module reloaded (in tests) finds the
    # names taken: its families count in-process only, and the first module's are exported.
    with contextlib.suppress(ValueError):
        _prometheus.REGISTRY.register(_Collector())


def available() -> bool:
    """Whether prometheus-client is installed, so the families can be served."""
    return _prometheus is not None


def serve(port: int, host: str) -> Any:
    """Serve ``/metrics`` on ``host:port`` from a thread of its own (prometheus-client's
    server); returns the server, to shut it down on drain."""
    if _prometheus is None:  # pragma: no cover - the CLI checks ``available`` first
        raise RuntimeError(
            "prometheus-client is not installed: pip install 'flowx-runtime[prometheus]'"
        )
    server, _thread = _prometheus.start_http_server(port, addr=host)
    return server
