"""A child's last commit lands but its answer is lost (R9.1): the run re-reads the child
under the lease it still holds, finds it ended, and wakes the parent itself — it does not
leave the parent to the next recovery sweep (there is none on these hosts)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

import flowx
from flowx.stores.errors import JournalNoAnswer
from flowx.stores.records import InstanceState, StepCommit
from tests.engine.kit import Ledger, Order, until_state
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse

ledger = Ledger("settled")
label = ledger.capability("label", returns=lambda parcel: f"L-{parcel.order_id}")
ship = ledger.capability("ship", returns=lambda order: f"S-{order.order_id}")


class Parcel(BaseModel):
    order_id: str


class ParcelState(BaseModel):
    label: str | None = None


class OrderState(BaseModel):
    parcel: ParcelState | None = None
    shipped: str | None = None


child = (
    flowx.flow("settled.child", version="1", input=Parcel, state=ParcelState)
    .step(label, into="label")
    .build()
)
parent = (
    flowx.flow("settled.parent", version="1", input=Order, state=OrderState)
    .sub_flow(child, lambda o, s: Parcel(order_id=o.order_id), into="parcel")
    .step(ship, into="shipped")
    .build()
)


async def test_a_child_whose_last_commit_got_no_answer_still_wakes_its_parent(
    host_factory: Any, memory_store: Any
) -> None:
    real = memory_store.journal.commit
    lost: list[str] = []

    async def answer_lost(commit: StepCommit) -> int | None:
        seq = await real(commit)
        if commit.notify_parent and not lost:
            lost.append(commit.instance_id)
            raise JournalNoAnswer("the answer to the child's last commit was lost")
        return seq

    memory_store.journal.commit = answer_lost
    host = await host_factory(parent, child)
    handle = await host.start(parent, Order(order_id="o1"))
    record = await until_state(host, handle.instance_id, InstanceState.COMPLETED)
    assert lost, "the child's last commit was never reached"
    assert (await host.get(lost[0])).state is InstanceState.COMPLETED
    assert record.state is InstanceState.COMPLETED
    assert ledger.calls["label"] == 1 and ledger.calls["ship"] == 1
