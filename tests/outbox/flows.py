"""A flow that emits, shared by the outbox tests: each order stages three events under the
order's own key, so each key's events carry a known order (``n`` = 1, 2, 3)."""

from __future__ import annotations

from pydantic import BaseModel

import flowx


class Order(BaseModel):
    order_id: str
    tenant: str = "acme"


class OrderState(BaseModel):
    note: str | None = None


@flowx.event("shop.order_event", version="1", sensitive={"card"})
class OrderEvent(BaseModel):
    order_id: str
    n: int
    card: str = "4242 4242 4242 4242"


@flowx.capability("shop.accept", version="1.0.0")
async def accept(ctx: flowx.StepContext, order: Order) -> str:
    return f"accepted {order.order_id}"


def by_order(o: Order, s: OrderState) -> str:
    return o.order_id


order_flow = (
    flowx.flow("shop.order", version="1.0.0", input=Order, state=OrderState)
    .step(accept, into="note")
    .emit(
        OrderEvent,
        lambda o, s: OrderEvent(order_id=o.order_id, n=1),
        name="event-1",
        partition_key=by_order,
    )
    .emit(
        OrderEvent,
        lambda o, s: OrderEvent(order_id=o.order_id, n=2),
        name="event-2",
        partition_key=by_order,
    )
    .emit(
        OrderEvent,
        lambda o, s: OrderEvent(order_id=o.order_id, n=3),
        name="event-3",
        partition_key=by_order,
    )
    .build()
)
