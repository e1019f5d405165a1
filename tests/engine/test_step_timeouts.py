"""Step timeouts and a flow deadline that reaches a running step (R9.3, issue 12 item 4; SPEC §8
"deadline", R4.2 no automatic retry of a non-idempotent capability, R2.12 build-time checks).

An async capability past its bound is cancelled; a sync one (in a thread, which cannot be
killed) is abandoned and its thread counted as stuck until it returns. Nothing here sleeps to
wait: hung capabilities wait on events the test sets, and the step bounds are what end them.
Run on memory here and on SQLite and PostgreSQL by ``tests/hosting/test_constructs_on_stores``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

import flowx
from flowx.capability import capability_of
from flowx.engine.timeouts import STEP_TIMED_OUT, invoke_bounded
from flowx.metrics import CAPABILITY_THREADS_STUCK
from flowx.stores.records import Outcome, StepRecord
from tests.engine.kit import Ledger, rows_of
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse

ledger = Ledger("timeouts")
timeout_calls = ledger.calls
#: Attempts (1-based) at which the hanging capabilities hang; others return at once.
hang_on: set[int] = ledger.also_clears(set())
cancelled: list[int] = ledger.also_clears([])
#: Set by the test to let a hung sync capability's thread return.
released = threading.Event()


@pytest.fixture(autouse=True)
def _reset_timeouts() -> Iterator[None]:
    released.clear()
    yield
    released.set()  # never leave a thread behind for the next test


class Job(BaseModel):
    job_id: str


class JobState(BaseModel):
    held: str | None = None
    out: str | None = None


hold = ledger.capability("hold", returns=lambda job: f"H-{job.job_id}")
unhold = ledger.undo("unhold")


@flowx.capability("timeouts.hang_async", version="1.0.0")
async def hang_async(ctx: flowx.StepContext, job: Job) -> str:
    timeout_calls["hang_async"] += 1
    if ctx.attempt in hang_on:
        try:
            await asyncio.Event().wait()  # nothing sets it: only a cancellation ends this
        except asyncio.CancelledError:
            cancelled.append(ctx.attempt)
            raise
    return "done"


@flowx.capability("timeouts.hang_once", version="1.0.0", idempotent=False)
async def hang_once(ctx: flowx.StepContext, job: Job) -> str:
    timeout_calls["hang_once"] += 1
    await asyncio.Event().wait()
    return "never"


@flowx.capability("timeouts.hang_sync", version="1.0.0")
def hang_sync(ctx: flowx.StepContext, job: Job) -> str:
    timeout_calls["hang_sync"] += 1
    if ctx.attempt in hang_on:
        released.wait()
    return "done"


@flowx.capability("timeouts.own_timeout_sync", version="1.0.0")
def own_timeout_sync(ctx: flowx.StepContext, job: Job) -> str:
    timeout_calls["own_timeout_sync"] += 1
    raise TimeoutError("upstream read timed out")


@flowx.capability("timeouts.own_timeout_async", version="1.0.0")
async def own_timeout_async(ctx: flowx.StepContext, job: Job) -> str:
    timeout_calls["own_timeout_async"] += 1
    raise TimeoutError("upstream read timed out")


FAST = flowx.Retry(attempts=3, backoff="none")


def _flow(name: str, target: Any, **kw: Any) -> flowx.FlowBuilder[Job]:
    return flowx.flow(f"timeouts.{name}", version="1", input=Job, state=JobState, **kw)


def _codes(rows: list[StepRecord], step: str) -> list[str | None]:
    return [
        flowx.codec.loads(r.result).get("code") if r.outcome is Outcome.FAILURE else "ok"
        for r in rows
        if r.step_name == step
    ]


async def _ended(host: flowx.FlowHost, plan: flowx.Plan, job: str) -> tuple[str, Any, str]:
    handle = await host.start(plan, Job(job_id=job))
    try:
        await handle.result(timeout=30)
    except flowx.FlowFailed as failed:
        return failed.state, failed.error, handle.instance_id
    return "Completed", None, handle.instance_id


async def test_hung_async_step_is_cancelled_and_fails_step_timed_out(host_factory: Any) -> None:
    hang_on.update({1, 2, 3})
    plan = _flow("async_all", hang_async).step(hang_async, timeout="50ms", retry=FAST).build()
    host = await host_factory(plan)
    state, error, iid = await _ended(host, plan, "a1")
    assert state == "Failed"
    assert error["code"] == STEP_TIMED_OUT
    assert cancelled == [1, 2, 3]  # every attempt was cancelled, not left running
    rows = await rows_of(host, iid)
    assert _codes(rows, "timeouts.hang_async") == [STEP_TIMED_OUT] * 3


@pytest.mark.parametrize(
    ("cap", "timeout"),
    [(own_timeout_sync, None), (own_timeout_sync, "30s"), (own_timeout_async, "30s")],
    ids=["sync-unbounded", "sync-bounded", "async-bounded"],
)
async def test_a_capabilitys_own_timeout_error_is_its_failure_not_a_step_timeout(
    host_factory: Any, cap: Any, timeout: str | None
) -> None:
    """A ``TimeoutError`` the capability raised itself (a client library's) fails the attempt
    as what it is — retried, journaled with its own message — never as the step running past
    its bound (``step.timed_out``, the thread counted stuck)."""
    name = f"own_{cap.__name__}_{timeout or 'none'}"
    plan = _flow(name, cap).step(cap, timeout=timeout, retry=FAST).build()
    host = await host_factory(plan)
    state, error, iid = await _ended(host, plan, f"own-{timeout}")
    assert state == "Failed"
    assert error["type"] == "TimeoutError" and error["message"] == "upstream read timed out"
    assert error["code"] != STEP_TIMED_OUT
    assert timeout_calls[cap.__name__] == 3  # every attempt ran
    assert host.stuck_threads == 0  # and none was abandoned as if it were still running
    rows = [r for r in await rows_of(host, iid) if r.step_name == f"timeouts.{cap.__name__}"]
    assert [flowx.codec.loads(r.result)["message"] for r in rows] == ["upstream read timed out"] * 3


async def test_timed_out_attempt_is_retried_under_its_policy(host_factory: Any) -> None:
    hang_on.add(1)
    plan = (
        _flow("async_retry", hang_async)
        .step(hang_async, timeout="50ms", retry=FAST, into="out")
        .build()
    )
    host = await host_factory(plan)
    state, _, iid = await _ended(host, plan, "a2")
    assert state == "Completed"
    assert _codes(await rows_of(host, iid), "timeouts.hang_async") == [STEP_TIMED_OUT, "ok"]


async def test_flow_step_timeout_is_the_default_and_a_step_may_override_it(
    host_factory: Any,
) -> None:
    hang_on.add(1)
    plan = (
        _flow("async_default", hang_async, step_timeout="50ms")
        .step(hang_async, retry=FAST, into="out")
        .build()
    )
    node = plan.nodes()[0]
    assert isinstance(node, flowx.plan.model.StepNode)
    assert node.timeout is not None and node.timeout.total_seconds() == 0.05
    longer = _flow("async_own", hang_async, step_timeout="50ms").step(hang_async, timeout="2h")
    own = longer.build().nodes()[0]
    assert isinstance(own, flowx.plan.model.StepNode)
    assert own.timeout is not None and own.timeout.total_seconds() == 7200
    host = await host_factory(plan)
    state, _, iid = await _ended(host, plan, "a3")
    assert state == "Completed"
    assert _codes(await rows_of(host, iid), "timeouts.hang_async") == [STEP_TIMED_OUT, "ok"]


async def test_non_idempotent_step_that_timed_out_is_not_retried(host_factory: Any) -> None:
    plan = _flow("once", hang_once).step(hang_once, timeout="50ms").build()
    host = await host_factory(plan)
    state, error, iid = await _ended(host, plan, "a4")
    assert state == "Failed"
    assert error["code"] == STEP_TIMED_OUT
    assert timeout_calls["hang_once"] == 1
    assert _codes(await rows_of(host, iid), "timeouts.hang_once") == [STEP_TIMED_OUT]


async def test_flow_deadline_cancels_the_running_step_and_compensates(host_factory: Any) -> None:
    hang_on.update({1, 2, 3})
    plan = (
        _flow("deadline_async", hang_async, deadline="300ms")
        .step(hold, into="held", compensate=unhold)
        .step(hang_async, retry=FAST)  # no step timeout: only the flow deadline cuts it
        .build()
    )
    host = await host_factory(plan)
    state, error, iid = await _ended(host, plan, "d1")
    assert state == "TimedOut"
    assert error["code"] == "flow.deadline_exceeded"
    assert "while step" in error["message"]
    assert cancelled == [1]  # cut, and not retried: the flow is over
    assert timeout_calls["unhold"] == 1
    rows = await rows_of(host, iid)
    assert _codes(rows, "timeouts.hang_async") == ["flow.deadline_exceeded"]
    assert [r.step_name for r in rows if r.outcome is Outcome.COMPENSATED] == ["timeouts.hold"]


async def test_step_timeout_shorter_than_the_deadline_still_retries(host_factory: Any) -> None:
    hang_on.add(1)
    plan = (
        _flow("deadline_far", hang_async, deadline="1h")
        .step(hang_async, timeout="50ms", retry=FAST, into="out")
        .build()
    )
    host = await host_factory(plan)
    state, _, iid = await _ended(host, plan, "d2")
    assert state == "Completed"
    assert _codes(await rows_of(host, iid), "timeouts.hang_async") == [STEP_TIMED_OUT, "ok"]


def _wait_stuck_at_most(host: flowx.FlowHost, count: int) -> bool:
    threads = host._threads
    assert threads is not None
    return threads.wait_stuck_at_most(count, timeout=30)


async def test_hung_sync_step_is_abandoned_counted_and_uncounted_when_it_returns(
    host_factory: Any,
) -> None:
    hang_on.add(1)
    plan = (
        _flow("sync_hang", hang_sync)
        .step(hang_sync, timeout="100ms", retry=flowx.Retry(attempts=1))
        .build()
    )
    host = await host_factory(plan)
    state, error, iid = await _ended(host, plan, "s1")
    assert state == "Failed"
    assert error["code"] == STEP_TIMED_OUT
    assert _codes(await rows_of(host, iid), "timeouts.hang_sync") == [STEP_TIMED_OUT]
    assert host.stuck_threads == 1
    assert CAPABILITY_THREADS_STUCK.get(host.node_id) == 1
    released.set()
    assert await asyncio.to_thread(_wait_stuck_at_most, host, 0)
    assert host.stuck_threads == 0
    assert CAPABILITY_THREADS_STUCK.get(host.node_id) == 0


async def test_all_threads_stuck_is_reported(host_factory: Any) -> None:
    hang_on.add(1)
    plan = (
        _flow("sync_all_stuck", hang_sync)
        .step(hang_sync, timeout="100ms", retry=flowx.Retry(attempts=1))
        .build()
    )
    host = await host_factory(plan, settings=flowx.HostSettings.load(capability_threads=1))
    assert not host.threads_all_stuck
    state, _, _ = await _ended(host, plan, "s2")
    assert state == "Failed"
    assert host.threads_all_stuck
    released.set()
    assert await asyncio.to_thread(_wait_stuck_at_most, host, 0)
    assert not host.threads_all_stuck


async def test_flow_deadline_abandons_a_hung_sync_step_and_compensates(host_factory: Any) -> None:
    hang_on.add(1)
    plan = (
        _flow("deadline_sync", hang_sync, deadline="300ms")
        .step(hold, into="held", compensate=unhold)
        .step(hang_sync)
        .build()
    )
    host = await host_factory(plan)
    state, error, _ = await _ended(host, plan, "d3")
    assert state == "TimedOut"
    assert error["code"] == "flow.deadline_exceeded"
    assert timeout_calls["unhold"] == 1
    assert timeout_calls["hang_sync"] == 1
    assert host.stuck_threads == 1
    released.set()
    assert await asyncio.to_thread(_wait_stuck_at_most, host, 0)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0s", "must be positive"),
        (0, "must be positive"),
        ("-1s", "not a duration"),
        (-5, "must not be negative"),
        ("soon", "not a duration"),
        ("8d", "longer than 7 days"),
        (10**20, "longest duration FlowX accepts"),
        (True, "not a bool"),
    ],
)
def test_builder_refuses_a_bad_step_timeout_naming_the_step(value: Any, says: str) -> None:
    with pytest.raises(flowx.PlanError) as bad:
        _flow("bad_timeout", hold).step(hold, name="hold.it", timeout=value).build()
    assert bad.value.code == "FLOWX1025"
    assert "step 'hold.it'" in str(bad.value)
    assert says in str(bad.value)


@pytest.mark.parametrize("value", ["0ms", "soon", "30d"])
def test_builder_refuses_a_bad_flow_step_timeout(value: Any) -> None:
    with pytest.raises(flowx.PlanError) as bad:
        _flow("bad_default", hold, step_timeout=value).step(hold).build()
    assert bad.value.code == "FLOWX1025"
    assert "step_timeout=" in str(bad.value)


async def test_without_a_host_executor_a_capabilitys_own_timeout_error_is_its_own_too() -> None:
    """The thread path of a bare run (no host: the loop's default executor), bounded."""
    cap = capability_of(own_timeout_sync)
    assert cap is not None
    with pytest.raises(TimeoutError, match="upstream read timed out") as raised:
        await invoke_bounded(
            cap,
            None,
            Job(job_id="bare"),
            None,
            limit=30.0,
            by_deadline=False,
            what="bare",
        )
    assert type(raised.value) is TimeoutError  # not StepTimedOut, a TimeoutError subclass
