"""Flows the ingress tests start by message, importable by a ``flowx worker --flows`` process
(``tests.ingress.flows:FLOWS``) as well as by in-process hosts."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

import flowx


class Order(BaseModel):
    """A start's input."""

    order_id: str
    quantity: int = 1


class Paid(BaseModel):
    """The payload of the ``paid`` signal."""

    amount: int


@flowx.capability("ing.confirm", version="1.0.0")
async def confirm(ctx: flowx.StepContext, order: Order) -> str:
    """One durable step, so a started instance has something to commit before it completes."""
    return f"confirmed {order.order_id}"


@flowx.capability("ing.pack", version="1.0.0")
async def pack(ctx: flowx.StepContext, order: Order) -> str:
    """A step that takes a while, as real work does: a worker with two flow slots is then
    still mid-batch when a test kills it."""
    await asyncio.sleep(0.3)
    return f"packed {order.order_id}"


ORDER = flowx.flow("ing.order", version="1", input=Order).step(confirm).build()
WAITING = flowx.flow("ing.wait", version="1", input=Order).await_signal("paid", Paid).build()
SLOW = flowx.flow("ing.slow", version="1", input=Order).step(pack).build()
FLOWS = [ORDER, WAITING, SLOW]
