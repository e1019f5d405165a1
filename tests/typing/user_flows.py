"""A user's module, written the way README.md "## A flow" shows, for ``test_user_typing``.

Never imported or run: ``mypy --strict`` reads it against the installed package (through its
``py.typed`` marker), from a directory of its own. Two kinds of marked line:

- ``reveal_type(x)`` after a comment "revealed: T" (continued on comment lines indented
  further if long): mypy must reveal exactly ``T``;
- a trailing comment "mypy-error: code" (optionally ": text"): mypy must refuse that line,
  with that error code (and a message holding that text).

Any other error mypy reports fails the test.
"""

from __future__ import annotations

from typing import assert_type, reveal_type

from pydantic import BaseModel

import flowx
from flowx.stores.records import StepCommit, StepRecord


class Order(BaseModel):
    order_id: str
    amount_cents: int


class OrderState(BaseModel):
    reservation: str | None = None
    receipt: str | None = None


class Refund(BaseModel):
    refund_id: str


@flowx.capability("typing.inventory.reserve", version="1.0.0")
async def reserve(ctx: flowx.StepContext, order: Order) -> str:
    return f"{ctx.idempotency_key}:{order.order_id}"


@flowx.capability("typing.inventory.release", version="1.0.0")
async def release(ctx: flowx.StepContext, order: Order) -> None:
    return None


@flowx.capability("typing.payment.capture", version="2.1.0", idempotent=False)
def capture(ctx: flowx.StepContext, order: Order) -> str:
    return ctx.idempotency_key


place_order = (
    flowx.flow("typing.order.place", version="1.2.0", input=Order, state=OrderState)
    .step(reserve, into="reservation", compensate=release)
    .step(capture, into="receipt", retry=flowx.Retry(attempts=1))
    .build()
)
# revealed: flowx.plan.model.Plan[user_flows.Order, user_flows.OrderState]
reveal_type(place_order)
assert_type(place_order, flowx.Plan[Order, OrderState])

# No state= declared: the state is FlowX's empty NoState model.
stateless = flowx.flow("typing.order.ping", version="1", input=Order).step(reserve).build()
# revealed: flowx.plan.model.Plan[user_flows.Order, flowx.plan.model.NoState]
reveal_type(stateless)

# The decorator keeps the function's own signature: a capability is still a typed function.
# revealed: def (ctx: flowx.engine.context.StepContext, order: user_flows.Order)
#     -> typing.Coroutine[Any, Any, str]
reveal_type(reserve)
# revealed: def (ctx: flowx.engine.context.StepContext, order: user_flows.Order) -> str
reveal_type(capture)

FLOWS: list[flowx.Plan] = [place_order, stateless]


async def main() -> None:
    async with flowx.FlowHost(store=flowx.sqlite("flowx.db"), flows=FLOWS) as host:
        handle = await host.start(
            place_order, Order(order_id="42", amount_cents=1999), idempotency_key="order-42"
        )
        # revealed: flowx.hosting.handle.FlowHandle[user_flows.OrderState]
        reveal_type(handle)
        state = await handle.result(timeout=30)
        # revealed: user_flows.OrderState
        reveal_type(state)
        receipt: str | None = state.receipt
        print(receipt)

        # A dict is validated against the input model at run time, as the CLI's JSON is.
        again = await host.start(place_order, {"order_id": "43", "amount_cents": 5})
        assert_type(again, flowx.FlowHandle[OrderState])

        # By flow id the plan is only known at run time: the state is some BaseModel.
        by_id = await host.start("typing.order.place", {"order_id": "44", "amount_cents": 1})
        assert_type(await by_id.result(), BaseModel)


async def misuse(host: flowx.FlowHost, ctx: flowx.StepContext, state: OrderState) -> None:
    """What a type checker must refuse."""
    # Another model as a plan's input: InputT is Order for place_order and cannot be Refund.
    await host.start(place_order, Refund(refund_id="r-1"))  # mypy-error: misc: "InputT"
    wrong: int = state.receipt  # mypy-error: assignment
    refunds: flowx.Plan[Order, Refund] = place_order  # mypy-error: assignment
    await reserve(ctx, "42")  # mypy-error: arg-type
    await reserve(host, Order(order_id="1", amount_cents=1))  # mypy-error: arg-type
    flowx.flow("typing.bad", version="1", input=dict)  # mypy-error: type-var
    flowx.Retry(attempts="3")  # mypy-error: arg-type
    print(wrong, refunds)


def store_author(commit: StepCommit, row: StepRecord) -> None:
    """A store is handed the engine's writes and hands out rows: neither is written to."""
    commit.token = 0  # mypy-error: misc: is read-only
    row.attempt = 2  # mypy-error: misc: is read-only
