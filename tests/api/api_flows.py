"""Flows for the HTTP API tests (``--flows tests.api.api_flows:FLOWS`` for ``flowx serve``).

``BROKEN`` holds the capabilities that fail right now, so a test can let an instance fail,
"fix" the fault and replay it through the API.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

import flowx

ONCE = flowx.Retry(attempts=1)
BROKEN: set[str] = set()


class Order(BaseModel):
    order_id: str = Field(min_length=1, max_length=40)
    qty: int = Field(default=1, ge=1, le=100)


class Shipment(BaseModel):
    carrier: str
    tracking: str


class OrderState(BaseModel):
    reservation: str | None = None
    shipment: Shipment | None = None
    note: str | None = None


@flowx.capability("api.reserve", version="1.0.0")
async def reserve(ctx: flowx.StepContext, order: Order) -> str:
    return f"R-{order.order_id}x{order.qty}"


@flowx.capability("api.release", version="1.0.0")
async def release(ctx: flowx.StepContext, order: Order) -> None:
    return None


@flowx.capability("api.notify", version="1.0.0")
async def notify(ctx: flowx.StepContext, order: Order) -> str:
    if "notify" in BROKEN:
        raise RuntimeError("mail relay down")
    return "sent"


#: Reserves, waits for ``shipped`` (a Shipment), then notifies.
shipping = (
    flowx.flow("api.ship", version="1.0.0", input=Order, state=OrderState)
    .step(reserve, into="reservation", compensate=release)
    .await_signal("shipped", Shipment, into="shipment", timeout="2d")
    .step(notify, into="note", retry=ONCE)
    .build()
)

#: Reserves and notifies: Failed while ``notify`` is broken, then replayable.
mail = (
    flowx.flow("api.mail", version="1.0.0", input=Order, state=OrderState)
    .step(reserve, into="reservation")
    .step(notify, into="note", retry=ONCE)
    .build()
)

#: No journal: runs within the request, even while the journal is down.
quote = (
    flowx.flow("api.quote", version="1.0.0", input=Order, state=OrderState, profile=flowx.Ephemeral)
    .step(reserve, into="reservation")
    .build()
)

FLOWS = [shipping, mail, quote]
