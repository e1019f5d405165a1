"""A finished instance leaves no reference cycle behind: every object a run builds (its
``Execution``, ``Run``, ports, lease, history index) is freed by reference counting the moment
the run ends. A cycle would leave them to the cyclic collector: on a busy node that is more
collections, each longer, on the hot path (a run holding a bound method of its ``Execution``
once cost B7 about 10 % at 64 in flight)."""

from __future__ import annotations

import gc
import types
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

import flowx


class Job(BaseModel):
    n: int


class JobState(BaseModel):
    last: int | None = None


@flowx.capability("cycles.noop", version="1.0.0")
async def noop(ctx: flowx.StepContext, job: Job) -> int:
    return job.n


PLAN = (
    flowx.flow("cycles.flow", version="1.0.0", input=Job, state=JobState)
    .step(noop, name="a", into="last")
    .step(noop, name="b", into="last")
    .build()
)


@pytest.fixture
def saved_garbage() -> Iterator[list[object]]:
    """The cyclic collector off, and what it would have freed kept for inspection."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
async def test_a_finished_durable_run_leaves_no_cycle(
    url: str, tmp_path: object, saved_garbage: list[object]
) -> None:
    store = flowx.from_url(f"sqlite:///{tmp_path}/c.db" if url == "sqlite" else url)
    settings = flowx.HostSettings.load(recovery=False, timers=False)
    async with flowx.FlowHost(store=store, flows=[PLAN], settings=settings) as host:
        first = await host.start(PLAN, Job(n=0))
        await first.result(timeout=30, poll=0.001)
        gc.collect()
        saved_garbage.clear()
        for n in range(1, 21):
            handle = await host.start(PLAN, Job(n=n))
            assert (await handle.result(timeout=30, poll=0.001)).last == n
        del handle
        gc.collect()
        ours = sorted({type(o).__qualname__ for o in saved_garbage if _is_flowx(o)})
    assert ours == [], f"objects of finished runs freed only by the cyclic GC: {ours}"


def _is_flowx(o: object) -> bool:
    """An instance of a FlowX class, or a function (a closure, a lambda) FlowX defined."""
    if isinstance(o, types.FunctionType | types.MethodType):
        return str(getattr(o, "__module__", "")).startswith("flowx.")
    return type(o).__module__.startswith("flowx.")
