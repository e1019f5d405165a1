"""Flows for the clock-skew and slow-fsync tests (issue 12), imported by real ``flowx worker``
processes (``--flows tests.faults.skew_flows:FLOWS``).

Every step records its effect in a ledger kept outside the journal (``$FAULT_DIR/ledger.db``)
*before* it does anything else, with the worker's node name and pid: a step that ran twice has
two rows, whoever ran it. It then waits ``$FAULT_STEP_SECONDS`` (a long step: its lease must
be renewed while it runs), on the event loop, so the lease keeper of the node keeps running.
Every capability is ``idempotent=False``: nothing is retried automatically, so a second row is
a takeover's re-execution and nothing else.

``fault.parent`` runs ``fault.job`` as a sub-flow: the child instance is *created by the
worker* running the parent (not by a client), so the time stamped on it at creation is the
one that worker chose (R9.2).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from pathlib import Path

from pydantic import BaseModel

import flowx

LEDGER = "ledger.db"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS ledger (instance_id TEXT, step TEXT, attempt INTEGER, "
    "node TEXT, pid INTEGER, at REAL)"
)


class Job(BaseModel):
    n: int


class JobState(BaseModel):
    a: str | None = None
    b: str | None = None
    c: str | None = None


class ParentState(BaseModel):
    before: str | None = None


def prepare_ledger(directory: Path) -> None:
    """Create the ledger once, before any worker writes to it: switching a database to WAL
    takes a lock that concurrent writers would see as "database is locked" at once."""
    conn = sqlite3.connect(directory / LEDGER, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(_SCHEMA)
    finally:
        conn.close()


def _record(instance_id: str, step: str, attempt: int) -> None:
    path = Path(os.environ["FAULT_DIR"]) / LEDGER
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        conn.execute(
            "INSERT INTO ledger VALUES (?, ?, ?, ?, ?, ?)",
            (
                instance_id,
                step,
                attempt,
                os.environ.get("FAULT_NODE", "?"),
                os.getpid(),
                time.time(),
            ),
        )
    finally:
        conn.close()


async def _effect(ctx: flowx.StepContext, step: str) -> str:
    # Off the event loop: a ledger write that waits for SQLite's lock must not hold up the
    # node's lease renewals.
    await asyncio.to_thread(_record, ctx.instance_id, step, ctx.attempt)
    await asyncio.sleep(float(os.environ.get("FAULT_STEP_SECONDS", "0")))
    return f"{step}@{os.environ.get('FAULT_NODE', '?')}"


@flowx.capability("fault.a", version="1.0.0", idempotent=False)
async def step_a(ctx: flowx.StepContext, job: Job) -> str:
    return await _effect(ctx, "a")


@flowx.capability("fault.b", version="1.0.0", idempotent=False)
async def step_b(ctx: flowx.StepContext, job: Job) -> str:
    return await _effect(ctx, "b")


@flowx.capability("fault.c", version="1.0.0", idempotent=False)
async def step_c(ctx: flowx.StepContext, job: Job) -> str:
    return await _effect(ctx, "c")


@flowx.capability("fault.before", version="1.0.0", idempotent=False)
async def before(ctx: flowx.StepContext, job: Job) -> str:
    # Quick, whatever FAULT_STEP_SECONDS says: the parent reaches its sub-flow at once.
    await asyncio.to_thread(_record, ctx.instance_id, "before", ctx.attempt)
    return "before"


job = (
    flowx.flow("fault.job", version="1.0.0", input=Job, state=JobState)
    .step(step_a, into="a")
    .step(step_b, into="b")
    .step(step_c, into="c")
    .build()
)

parent = (
    flowx.flow("fault.parent", version="1.0.0", input=Job, state=ParentState)
    .step(before, into="before")
    .sub_flow(job, lambda j, s: j)
    .build()
)

FLOWS = [job, parent]
#: A node that can recover a child but never take a parent from the queue.
JOBS = [job]
