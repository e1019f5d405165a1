"""The capability thread pool (R9.3, issue 12 items 4–5): daemon threads, so a stuck one never
blocks the process exit; abandoned calls counted until they return; a full house reported.

Every wait here is on an event or a future, never a sleep.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from flowx.hosting.threads import CapabilityThreads
from flowx.metrics import CAPABILITY_THREADS_STUCK


def _exported(node: str) -> float | None:
    """The gauge as Prometheus scrapes it, when prometheus-client is installed."""
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return None
    value = REGISTRY.get_sample_value("flowx_capability_threads_stuck", {"node": node})
    assert value is not None, "the gauge is not exported"
    return float(value)


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # release whatever a failed test left blocked


def test_calls_run_on_daemon_threads_and_return_results_and_errors() -> None:
    pool = CapabilityThreads(2, node="n-results")
    try:
        assert pool.submit(lambda: threading.current_thread().daemon).result(timeout=30) is True
        assert pool.submit(lambda x: x * 2, 21).result(timeout=30) == 42
        failing = pool.submit(int, "not a number")
        with pytest.raises(ValueError):
            failing.result(timeout=30)
    finally:
        pool.shutdown()


def test_an_abandoned_call_is_counted_until_it_returns(gate: threading.Event) -> None:
    pool = CapabilityThreads(2, node="n-abandon")
    try:
        started = threading.Event()
        stuck = pool.submit(lambda: (started.set(), gate.wait()))
        assert started.wait(30)
        pool.abandon(stuck)
        assert pool.stuck == 1
        assert CAPABILITY_THREADS_STUCK.get("n-abandon") == 1
        assert _exported("n-abandon") in (1.0, None)  # None: flowx[prometheus] not installed
        assert not pool.all_stuck
        assert pool.submit(lambda: "the other thread still works").result(timeout=30)
        gate.set()
        assert pool.wait_stuck_at_most(0, timeout=30)
        assert pool.stuck == 0
        assert CAPABILITY_THREADS_STUCK.get("n-abandon") == 0
        assert _exported("n-abandon") in (0.0, None)
    finally:
        pool.shutdown()


def test_abandoning_a_finished_call_counts_nothing() -> None:
    pool = CapabilityThreads(1, node="n-finished")
    try:
        done = pool.submit(lambda: 1)
        done.result(timeout=30)
        pool.abandon(done)
        assert pool.stuck == 0
    finally:
        pool.shutdown()


def test_every_thread_stuck_is_reported(
    gate: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    pool = CapabilityThreads(1, node="n-full")
    try:
        started = threading.Event()
        call = pool.submit(lambda: (started.set(), gate.wait()))
        assert started.wait(30)
        with caplog.at_level(logging.ERROR, logger="flowx.threads"):
            pool.abandon(call)
        assert pool.all_stuck
        assert any("all 1 capability threads are stuck" in r.message for r in caplog.records)
    finally:
        gate.set()
        pool.shutdown()


def test_shutdown_does_not_wait_for_a_stuck_call_and_cancels_queued_work(
    gate: threading.Event,
) -> None:
    pool = CapabilityThreads(1, node="n-shutdown")
    started = threading.Event()
    stuck = pool.submit(lambda: (started.set(), gate.wait()))
    assert started.wait(30)
    queued = pool.submit(lambda: "never runs")
    pool.abandon(stuck)
    pool.shutdown(wait=True, cancel_futures=True)  # returns: the stuck call is not joined
    assert queued.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
    assert not stuck.done()
    gate.set()
    assert stuck.result(timeout=30) == (None, True)


def test_at_most_max_workers_threads_run_calls(gate: threading.Event) -> None:
    pool = CapabilityThreads(2, node="n-bound")
    try:
        running = threading.Semaphore(0)

        def hold() -> str:
            running.release()
            gate.wait()
            return threading.current_thread().name

        calls = [pool.submit(hold) for _ in range(3)]
        assert running.acquire(timeout=30) and running.acquire(timeout=30)
        assert not calls[2].running()  # queued behind the two threads
        gate.set()
        names = {c.result(timeout=30) for c in calls}
        assert len(names) == 2
    finally:
        pool.shutdown()
