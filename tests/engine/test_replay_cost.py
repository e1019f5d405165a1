"""Resuming an instance replays its committed rows into the state one field at a time: the
rest of the state is not re-validated per row (issue 14 item 6), so a resume of N rows costs
N field validations, not N whole-state validations. Counted, not timed."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from pydantic import BaseModel, field_validator

import flowx
from flowx.stores.records import InstanceState
from tests.engine.kit import Ledger, Order, until_state
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse
from tests.support.polling import until

ledger = Ledger("replaycost")
tick = ledger.capability("tick", returns=lambda order: order.order_id)
hold = ledger.capability("hold")
wrong = ledger.capability("wrong", returns=lambda order: {"not": "a list"})
STEPS = 40


class Heavy(BaseModel):
    """A state whose ``catalogue`` field counts how often it is validated."""

    validations: ClassVar[list[int]] = []
    catalogue: list[int] = list(range(100))
    last: str | None = None
    held: str | None = None

    @field_validator("catalogue")
    @classmethod
    def _count(cls, value: list[int]) -> list[int]:
        cls.validations.append(1)
        return value


def many_steps() -> flowx.Plan:
    builder: Any = flowx.flow("replaycost.many", version="1", input=Order, state=Heavy)
    for n in range(STEPS):
        builder = builder.step(tick, name=f"tick {n}", into="last")
    return builder.step(hold, into="held").build()


async def test_a_resume_validates_each_replayed_field_not_the_whole_state(
    host_factory: Any,
) -> None:
    plan = many_steps()
    first = await host_factory(plan)
    ledger.gates["hold"] = gate = asyncio.Event()
    handle = await first.start(plan, Order(order_id="o1"))

    async def holding() -> bool:
        return ledger.calls["hold"] == 1

    await until(holding, within=10, what="the last step running")
    await first.drain(timeout=0.05)  # cut mid-step: handed back with STEPS rows committed
    Heavy.validations.clear()
    gate.set()
    second = await host_factory(plan)
    assert await second.resume(handle.instance_id, queued=True) == "resumed"
    done = await until_state(second, handle.instance_id, InstanceState.COMPLETED)
    assert Heavy.model_validate_json(done.state_bag).held == "hold-done"
    # One for the fresh state the replay starts from; none per replayed row (STEPS of them).
    assert len(Heavy.validations) <= 2, len(Heavy.validations)


class Frozen(BaseModel, frozen=True):
    last: str | None = None


async def test_a_frozen_state_model_is_rebuilt_whole_and_still_applies(
    host_factory: Any,
) -> None:
    plan = (
        flowx.flow("replaycost.frozen", version="1", input=Order, state=Frozen)
        .step(tick, into="last")
        .build()
    )
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="f1"))
    done = await until_state(host, handle.instance_id, InstanceState.COMPLETED)
    assert Frozen.model_validate_json(done.state_bag).last == "f1"


async def test_a_value_that_does_not_fit_its_field_is_still_refused(host_factory: Any) -> None:
    """Only the field is validated, but it is validated: a bad result fails the step."""
    plan = (
        flowx.flow("replaycost.wrong", version="1", input=Order, state=Heavy)
        .step(wrong, into="catalogue", retry=flowx.Retry(attempts=1))
        .build()
    )
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="w1"))
    failed = await until_state(host, handle.instance_id, InstanceState.FAILED)
    assert "catalogue" in (failed.error or "")
