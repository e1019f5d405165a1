"""``StopWatch``: how an operator's stop cuts an attempt in flight (R9.4), and what it must
never do — swallow a drain's cancellation, or cut a compensation for a mere cancel."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from flowx.capability import capability_of
from flowx.engine.stops import StopReached, StopWatch
from flowx.engine.timeouts import invoke_bounded
from flowx.stores.records import StopRequest
from tests.engine.kit import Ledger
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse

ledger = Ledger("watch")
hang = capability_of(ledger.capability("hang"))
assert hang is not None


def _request(mode: str) -> StopRequest:
    return StopRequest(mode=mode, reason="r", by="ann", at=datetime(2026, 1, 1, tzinfo=UTC))


async def _attempt(watch: StopWatch, *, by_cancel: bool) -> object:
    return await invoke_bounded(
        hang, None, None, None, limit=None, by_deadline=False, what="t", stop=(watch, by_cancel)
    )


async def _started() -> None:
    async with asyncio.timeout(5):
        while ledger.calls["hang"] == 0:
            await asyncio.sleep(0)


async def test_a_stop_cuts_the_attempt_and_takes_its_cancellation_back() -> None:
    ledger.gates["hang"] = asyncio.Event()
    watch = StopWatch()
    task = asyncio.create_task(_attempt(watch, by_cancel=True))
    await _started()
    assert watch.tell(_request("cancel"))
    with pytest.raises(StopReached):
        await task
    assert task.cancelling() == 0  # nothing left pending on the run's task
    assert not watch.tell(_request("cancel"))  # already told: inert


async def test_a_cancel_does_not_cut_a_compensation_but_a_terminate_does() -> None:
    ledger.gates["hang"] = asyncio.Event()
    watch = StopWatch()
    task = asyncio.create_task(_attempt(watch, by_cancel=False))
    await _started()
    watch.tell(_request("cancel"))
    for _ in range(5):  # a cut would land at the task's next step: give it several
        await asyncio.sleep(0)
    assert not task.done()
    watch.tell(_request("terminate"))
    with pytest.raises(StopReached) as reached:
        await task
    assert reached.value.request.mode == "terminate"


async def test_a_drain_s_cancellation_is_never_swallowed() -> None:
    ledger.gates["hang"] = asyncio.Event()
    watch = StopWatch()
    seen: list[str] = []

    async def run() -> object:
        try:
            return await _attempt(watch, by_cancel=True)
        except StopReached:
            seen.append("stop")  # the run would go on to compensate while being drained
            raise

    task = asyncio.create_task(run())
    await _started()
    task.cancel()  # the drain
    watch.tell(_request("cancel"))  # and a stop, at once
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == []
    alone = asyncio.create_task(_attempt(StopWatch(), by_cancel=True))
    await asyncio.sleep(0)
    alone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await alone


async def test_a_stop_already_there_cuts_the_attempt_at_its_first_await() -> None:
    ledger.gates["hang"] = asyncio.Event()
    watch = StopWatch(_request("terminate"))
    with pytest.raises(StopReached):
        await _attempt(watch, by_cancel=False)


def test_a_watch_cuts_each_attempt_in_its_own_task_in_whatever_loop_runs_it() -> None:
    """The watch keeps the loop it found (asking for it anew costs a ``getpid`` system call
    on every attempt) yet arms the task each attempt runs in: two at once (fork branches)
    are both cut, and so is an attempt in a second loop once the first has closed."""
    watch = StopWatch()

    async def running(count: int) -> None:
        async with asyncio.timeout(5):
            while ledger.calls["hang"] < count:
                await asyncio.sleep(0)

    async def branches() -> None:
        ledger.gates["hang"] = asyncio.Event()
        tasks = [asyncio.create_task(_attempt(watch, by_cancel=True)) for _ in range(2)]
        await running(2)
        assert watch.tell(_request("cancel"))
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            assert isinstance(outcome, StopReached)

    async def later() -> None:
        ledger.gates["hang"] = asyncio.Event()
        task = asyncio.create_task(_attempt(watch, by_cancel=False))  # a cancel spares it
        await running(3)
        assert watch.tell(_request("terminate"))
        with pytest.raises(StopReached) as reached:
            await task
        assert reached.value.request.mode == "terminate" and task.cancelling() == 0

    asyncio.run(branches())
    asyncio.run(later())
