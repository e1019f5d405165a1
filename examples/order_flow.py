"""An order flow: reserve stock, capture payment, ship, announce.

Every capability records its effect in a *ledger* — a table in a separate SQLite file, outside
the journal — before it returns, the way a real side effect (a charge, an e-mail) happens
before FlowX can commit that it happened. Counting ledger rows against journal rows is how the
demo and the crash tests see a step that really ran twice.

The ledger path comes from ``FLOWX_DEMO_LEDGER``; each effect then waits ``FLOWX_DEMO_WORK_MS``
(default 150) milliseconds, which is the window in which a kill lands between effect and commit.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from datetime import UTC, datetime

from pydantic import BaseModel

import flowx


class Order(BaseModel):
    order_id: str
    amount_cents: int
    tenant: str = "demo"


class OrderState(BaseModel):
    reservation: str | None = None
    receipt: str | None = None
    shipment: str | None = None


@flowx.event("order.placed", version="1")
class OrderPlaced(BaseModel):
    order_id: str
    amount_cents: int


_lock = threading.Lock()
_conn: sqlite3.Connection | None = None


def _ledger() -> sqlite3.Connection:
    """One connection per process, used under a lock: the ledger is the demo's, not FlowX's,
    and should not make capabilities queue on SQLite's busy handler."""
    global _conn
    if _conn is None:
        path = os.environ.get("FLOWX_DEMO_LEDGER", "ledger.db")
        _conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        _conn.execute("PRAGMA journal_mode = WAL")
        _conn.execute(
            "CREATE TABLE IF NOT EXISTS ledger (instance_id TEXT, step TEXT, attempt INTEGER, "
            "idempotency_key TEXT, pid INTEGER, at TEXT)"
        )
    return _conn


def record_effect(ctx: flowx.StepContext) -> None:
    """The non-idempotent effect: one ledger row per execution, then the rest of the work."""
    with _lock:
        _ledger().execute(
            "INSERT INTO ledger VALUES (?, ?, ?, ?, ?, ?)",
            (
                ctx.instance_id,
                ctx.step_name,
                ctx.attempt,
                ctx.idempotency_key,
                os.getpid(),
                datetime.now(UTC).isoformat(),
            ),
        )
    time.sleep(int(os.environ.get("FLOWX_DEMO_WORK_MS", "150")) / 1000)


@flowx.capability("demo.inventory.reserve", version="1.0.0")
def reserve(ctx: flowx.StepContext, order: Order) -> str:
    record_effect(ctx)
    return f"RSV-{order.order_id}"


@flowx.capability("demo.inventory.release", version="1.0.0")
def release(ctx: flowx.StepContext, order: Order) -> None:
    record_effect(ctx)


@flowx.capability("demo.payment.capture", version="2.1.0", idempotent=False)
def capture(ctx: flowx.StepContext, order: Order) -> str:
    # A real gateway gets ctx.idempotency_key, so a re-execution after a crash is recognised.
    record_effect(ctx)
    return f"PAY-{order.order_id}-{order.amount_cents}"


@flowx.capability("demo.shipping.book", version="1.0.0")
def ship(ctx: flowx.StepContext, order: Order) -> str:
    record_effect(ctx)
    return f"SHP-{order.order_id}"


place_order = (
    flowx.flow(
        "order.place",
        version="1.2.0",
        input=Order,
        state=OrderState,
        partition_key=lambda o: o.tenant,
    )
    .step(reserve, into="reservation", compensate=release)
    .step(capture, into="receipt")
    .step(ship, into="shipment", retry=flowx.Retry(attempts=5, backoff="exponential"))
    .emit(OrderPlaced, lambda o, s: OrderPlaced(order_id=o.order_id, amount_cents=o.amount_cents))
    .build()
)

FLOWS = [place_order]
