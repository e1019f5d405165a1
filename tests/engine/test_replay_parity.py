"""``replay --dry-run`` lists exactly the compensations a real replay then runs, in the same
order: both take ``compensable`` and ``compensation_order`` from ``engine/saga.py``."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel

import flowx
from flowx.stores.records import InstanceState, Outcome

calls: Counter[str] = Counter()
broken: set[str] = set()


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()
    broken.clear()


class Order(BaseModel):
    order_id: str


class State(BaseModel):
    a: str | None = None
    b: str | None = None
    c: str | None = None


def _effect(name: str) -> Any:
    @flowx.capability(f"par.{name}", version="1")
    async def do(ctx: flowx.StepContext, order: Order) -> str:
        calls[name] += 1
        if name in broken:
            raise RuntimeError(f"{name} is down")
        return name.upper()

    return do


do_a, do_b, do_c, undo_a, undo_b, undo_c, finish = (
    _effect(n) for n in ("a", "b", "c", "undo_a", "undo_b", "undo_c", "finish")
)
ONCE = flowx.Retry(attempts=1)


def plan() -> flowx.Plan:
    return (
        flowx.flow("par.saga", version="1", input=Order, state=State)
        .step(do_a, into="a", compensate=undo_a, compensate_retry=ONCE)
        .fork(
            "both",
            lambda f: f.step(do_b, into="b", compensate=undo_b, compensate_retry=ONCE),
            lambda f: f.step(do_c, into="c", compensate=undo_c, compensate_retry=ONCE),
        )
        .step(finish, retry=ONCE)
        .build()
    )


async def test_a_dry_run_lists_what_the_real_replay_then_undoes_in_its_order(
    host_factory: Any,
) -> None:
    p = plan()
    host = await host_factory(p)
    broken.update({"finish", "undo_c"})
    handle = await host.start(p, Order(order_id="o1"))
    with pytest.raises(flowx.FlowFailed) as failed:
        await handle.result(timeout=5)
    assert failed.value.state == "CompensationFailed"
    assert host.store is not None
    before = list(await host.store.journal.steps(handle.instance_id))

    dry = await host.replay(handle.instance_id, "par.c", dry_run=True)
    assert dry.mode == "compensation" and dry.reruns[0] == "undo par.c [2.1]"
    assert dry.reruns[-1] == "undo par.a"  # the oldest effect is undone last

    broken.discard("undo_c")
    await host.replay(handle.instance_id, "par.c")
    await host.wait_idle(timeout=5)
    assert (await host.get(handle.instance_id)).state is InstanceState.FAILED
    after = list(await host.store.journal.steps(handle.instance_id))
    undone = [
        f"undo {r.step_name}" + (f" [{r.scope}]" if r.scope else "")
        for r in after[len(before) :]
        if r.outcome is Outcome.COMPENSATED
    ]
    assert tuple(undone) == dry.reruns, (undone, dry.reruns)
