"""A drain ends within its one budget even when a step never returns (R7.2, R9.3; issue 12
item 5): the run is cut — an async capability cancelled, a sync one's thread abandoned and
counted — the instance handed back ``Pending`` and its lease released so a peer takes it at
once, and nothing compensates.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

import flowx
from flowx.testing import FakeClock

entered = threading.Event()
released = threading.Event()
undone: list[str] = []


@pytest.fixture(autouse=True)
def _reset_drain() -> Iterator[None]:
    entered.clear()
    released.clear()
    undone.clear()
    yield
    released.set()


class Job(BaseModel):
    job_id: str


@flowx.capability("drain.first", version="1.0.0")
async def first(ctx: flowx.StepContext, job: Job) -> str:
    return "ok"


@flowx.capability("drain.undo_first", version="1.0.0")
async def undo_first(ctx: flowx.StepContext, job: Job) -> None:
    undone.append(job.job_id)


@flowx.capability("drain.hang_async", version="1.0.0")
async def hang_async(ctx: flowx.StepContext, job: Job) -> str:
    entered.set()
    await asyncio.Event().wait()
    return "never"


@flowx.capability("drain.hang_sync", version="1.0.0")
def hang_sync(ctx: flowx.StepContext, job: Job) -> str:
    entered.set()
    released.wait()
    return "late"


def _plan(name: str, hung: Any) -> flowx.Plan:
    return (
        flowx.flow(f"drain.{name}", version="1", input=Job)
        .step(first, compensate=undo_first)
        .step(hung)
        .build()
    )


@pytest.mark.parametrize("hung", [hang_async, hang_sync], ids=["async", "sync"])
async def test_drain_cuts_a_hung_step_and_releases_its_lease(
    hung: Any, clock: FakeClock, memory_store: Any
) -> None:
    plan = _plan(hung.__name__, hung)
    host = flowx.FlowHost(
        store=memory_store,
        flows=[plan],
        clock=clock,
        settings=flowx.HostSettings.load(recovery=False, timers=False),
    )
    await host.open()
    handle = await host.start(plan, Job(job_id="j1"))
    assert await asyncio.to_thread(entered.wait, 30)
    stuck_before = host.stuck_threads
    threads = host._threads
    await host.drain(timeout=0.2)
    assert host.in_flight == 0
    if hung is hang_sync:
        assert threads is not None and threads.stuck == stuck_before + 1  # abandoned, counted
    await memory_store.open()
    try:
        record = await memory_store.journal.get(handle.instance_id)
        # Handed back at once, as a drain's yield at a boundary is: the next sweep takes it.
        assert record.state is flowx.InstanceState.PENDING
        taken = await memory_store.leases.acquire(
            handle.instance_id, owner="peer", ttl=timedelta(seconds=30), now=clock.store_time()
        )
        assert taken is not None  # released: a peer takes it now, not after a TTL
    finally:
        await memory_store.close()
    assert undone == []  # cut by a drain is not a failure: nothing compensates
