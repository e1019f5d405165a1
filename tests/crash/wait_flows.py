"""Flows that *wait*, for the crash test that kills a worker while instances are suspended on a
signal, asleep on a durable timer and mid-compensation (tests/crash/test_kill_with_waits.py).
Real worker processes import them with ``--flows tests.crash.wait_flows:FLOWS``.

Every capability records its effect as one row of a SQLite ledger outside the journal
(``$CRASH_DIR/ledger.db``): instance id, step, attempt, whether it ran as a compensation,
the pid of the process that did it and the wall-clock time. The test counts those rows to see
how many times each effect really happened, and where.

Parking (how the test kills a worker mid-compensation): when ``$CRASH_DIR/park-undo_a``
exists, ``undo_a`` parks **once per instance**, *after* its effect is in the ledger and before
it returns (so before its ``Compensated`` row is committed): it writes
``parked-undo_a-<instance id>`` and hangs until SIGKILL. The re-execution on the next worker
finds that file and goes on. So a killed compensation leaves exactly two ``undo_a`` effects
per instance: the one the dead worker made and the re-execution's.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from pydantic import BaseModel

import flowx


class Item(BaseModel):
    name: str
    #: Seconds step ``a`` of the sleep flow takes, so the sleepers' wake times are spread out.
    delay: float = 0.0


class Go(BaseModel):
    token: str


class WaitState(BaseModel):
    a: str | None = None
    b: str | None = None
    go: Go | None = None


def _dir() -> Path:
    return Path(os.environ["CRASH_DIR"])


def parked_marker(crash_dir: Path, instance_id: str) -> Path:
    """The file ``undo_a`` writes when it parks for ``instance_id``."""
    return crash_dir / f"parked-undo_a-{instance_id}"


def _record(ctx: flowx.StepContext, step: str) -> str:
    conn = sqlite3.connect(_dir() / "ledger.db", timeout=30, isolation_level=None)
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS ledger (instance_id TEXT, step TEXT, attempt INTEGER, "
            "compensating INTEGER, pid INTEGER, at REAL)"
        )
        conn.execute(
            "INSERT INTO ledger VALUES (?, ?, ?, ?, ?, ?)",
            (ctx.instance_id, step, ctx.attempt, int(ctx.compensating), os.getpid(), time.time()),
        )
    finally:
        conn.close()
    return f"{step}-done"


@flowx.capability("waits.a", version="1.0.0")
def step_a(ctx: flowx.StepContext, item: Item) -> str:
    time.sleep(item.delay)
    return _record(ctx, "a")


@flowx.capability("waits.b", version="1.0.0", idempotent=False)
def step_b(ctx: flowx.StepContext, item: Item) -> str:
    return _record(ctx, "b")


@flowx.capability("waits.undo_a", version="1.0.0")
def undo_a(ctx: flowx.StepContext, item: Item) -> None:
    _record(ctx, "undo_a")
    marker = parked_marker(_dir(), ctx.instance_id)
    if (_dir() / "park-undo_a").exists() and not marker.exists():
        marker.write_text(str(os.getpid()))
        time.sleep(3600)  # until SIGKILL


@flowx.capability("waits.boom", version="1.0.0")
def boom(ctx: flowx.StepContext, item: Item) -> None:
    """Fails at once, before any effect: the ledger must never hold a ``boom`` row."""
    raise flowx.NonRetryableError(f"boom for {item.name}")


signal_flow = (
    flowx.flow("waits.signal", version="1.0.0", input=Item, state=WaitState)
    .step(step_a, name="a", into="a")
    .await_signal("go", Go, into="go", timeout="1h")
    .step(step_b, name="b", into="b")
    .build()
)

sleep_flow = (
    flowx.flow("waits.sleep", version="1.0.0", input=Item, state=WaitState)
    .step(step_a, name="a", into="a")
    .sleep("3s", name="nap")
    .step(step_b, name="b", into="b")
    .build()
)

saga_flow = (
    flowx.flow("waits.saga", version="1.0.0", input=Item, state=WaitState)
    .step(
        step_a,
        name="a",
        into="a",
        compensate=undo_a,
        compensate_retry=flowx.Retry(attempts=3, backoff="fixed", initial="100ms"),
    )
    .step(boom, name="boom")
    .build()
)

FLOWS = [signal_flow, sleep_flow, saga_flow]
