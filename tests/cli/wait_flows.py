"""Flows for the signal / replay / show CLI tests (``--flows tests.cli.wait_flows:FLOWS``).

A capability named ``X`` fails while a file ``X`` exists in the directory that
``FLOWX_CLI_FAULTS`` names, so a test can break a dependency, let an instance fail, then "fix
the fault" by deleting the file and replay it — from the CLI process or from the test alike.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

import flowx

FAULTS_ENV = "FLOWX_CLI_FAULTS"
NO_WAIT = flowx.Retry(attempts=2, backoff="none")
ONCE = flowx.Retry(attempts=1)


def broken(name: str) -> bool:
    """Whether the fault ``name`` is switched on (its marker file exists)."""
    where = os.environ.get(FAULTS_ENV)
    return where is not None and (Path(where) / name).exists()


def calls(name: str) -> int:
    """How many times the capability ``name`` ran (counted in ``<faults>/<name>.calls``)."""
    where = os.environ.get(FAULTS_ENV)
    path = Path(where or ".") / f"{name}.calls"
    return len(path.read_text()) if path.exists() else 0


def _count(name: str) -> None:
    where = os.environ.get(FAULTS_ENV)
    if where:
        with (Path(where) / f"{name}.calls").open("a") as f:
            f.write("x")


class Order(BaseModel):
    order_id: str


class Shipment(BaseModel):
    carrier: str
    tracking: str


class OrderState(BaseModel):
    reservation: str | None = None
    receipt: str | None = None
    shipment: Shipment | None = None
    note: str | None = None


@flowx.capability("cli.reserve", version="1.0.0")
async def reserve(ctx: flowx.StepContext, order: Order) -> str:
    _count("reserve")
    return f"R-{order.order_id}"


@flowx.capability("cli.release", version="1.0.0")
async def release(ctx: flowx.StepContext, order: Order) -> None:
    _count("release")
    if broken("release"):
        raise RuntimeError("inventory service refused the release")


@flowx.capability("cli.capture", version="1.0.0")
async def capture(ctx: flowx.StepContext, order: Order) -> str:
    _count("capture")
    if broken("capture"):
        raise RuntimeError("card declined by the gateway")
    return "P-1"


@flowx.capability("cli.notify", version="1.0.0")
async def notify(ctx: flowx.StepContext, order: Order) -> str:
    _count("notify")
    if broken("notify"):
        raise RuntimeError("mail relay down")
    return "sent"


#: Reserves, then waits for ``shipped`` (a Shipment) and notifies.
shipping = (
    flowx.flow("cli.ship", version="1.0.0", input=Order, state=OrderState)
    .step(reserve, into="reservation")
    .await_signal("shipped", Shipment, into="shipment", timeout="2d")
    .step(notify, into="note")
    .build()
)

#: Capture fails while ``capture`` is broken; undoing the reservation fails while ``release``
#: is: both broken gives CompensationFailed, which a replay re-runs once ``release`` is fixed.
saga = (
    flowx.flow("cli.saga", version="1.0.0", input=Order, state=OrderState)
    .step(reserve, into="reservation", compensate=release, compensate_retry=NO_WAIT)
    .step(capture, into="receipt", retry=ONCE)
    .build()
)

#: No compensation: a failed notify leaves it Failed, which replays forward.
mail = (
    flowx.flow("cli.mail", version="1.0.0", input=Order, state=OrderState)
    .step(reserve, into="reservation")
    .step(notify, into="note", retry=ONCE)
    .build()
)


#: Runs the shipping flow as a child: the parent waits for the child, the child for ``shipped``.
parcel = (
    flowx.flow("cli.parcel", version="1.0.0", input=Order, state=OrderState)
    .sub_flow(shipping, lambda order, state: order, name="ship it")
    .build()
)

FLOWS = [shipping, saga, mail, parcel]
#: Everything but the shipping flow: `flowx signal` must say which module to pass.
WITHOUT_SHIPPING = [saga, mail]
