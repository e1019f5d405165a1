"""``replay --dry-run`` lists exactly the compensations a real replay then runs, in the same
order: both take ``compensable`` and ``compensation_order`` from ``engine/saga.py``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

import flowx
from flowx.stores.records import InstanceState, Outcome
from tests.engine import kit
from tests.engine.kit import Ledger, failure_of, rows_of
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse

ledger = Ledger("par")
ONCE = flowx.Retry(attempts=1)


class State(BaseModel):
    a: str | None = None
    b: str | None = None
    c: str | None = None


def plan() -> flowx.Plan:
    """Three effects, two of them in fork branches, then a step that fails."""

    def effect(name: str) -> dict[str, Any]:
        return {"into": name, "compensate": ledger.undo(f"undo_{name}"), "compensate_retry": ONCE}

    return (
        flowx.flow("par.saga", version="1", input=kit.Order, state=State)
        .step(ledger.capability("a"), **effect("a"))
        .fork(
            "both",
            lambda f: f.step(ledger.capability("b"), **effect("b")),
            lambda f: f.step(ledger.capability("c"), **effect("c")),
        )
        .step(ledger.capability("finish"), retry=ONCE)
        .build()
    )


async def test_a_dry_run_lists_what_the_real_replay_then_undoes_in_its_order(
    host_factory: Any,
) -> None:
    p = plan()
    host = await host_factory(p)
    ledger.broken.update({"finish", "undo_c"})
    handle = await host.start(p, kit.Order(order_id="o1"))
    assert (await failure_of(handle)).state == "CompensationFailed"
    before = await rows_of(host, handle.instance_id)

    dry = await host.replay(handle.instance_id, "par.c", dry_run=True)
    assert dry.mode == "compensation" and dry.reruns[0] == "undo par.c [2.1]"
    assert dry.reruns[-1] == "undo par.a"  # the oldest effect is undone last

    ledger.broken.discard("undo_c")
    await host.replay(handle.instance_id, "par.c")
    await host.wait_idle(timeout=5)
    assert (await host.get(handle.instance_id)).state is InstanceState.FAILED
    after = await rows_of(host, handle.instance_id)
    undone = [
        f"undo {r.step_name}" + (f" [{r.scope}]" if r.scope else "")
        for r in after[len(before) :]
        if r.outcome is Outcome.COMPENSATED
    ]
    assert tuple(undone) == dry.reruns, (undone, dry.reruns)
