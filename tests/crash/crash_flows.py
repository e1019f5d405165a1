"""Flows for the crash tests, imported by real worker processes (``--flows``).

Each capability records its effect in a ledger file outside the journal. A capability can be
told, through files, to *park* — signal that it has reached a point and then hang — so the
test can SIGKILL the process at exactly that point:

- ``park-after-effect-<step>``: after the effect is in the ledger, before the step returns
  (so before its commit);
- ``park-before-effect-<step>``: before the effect (so every earlier commit has landed).

A park happens once per step: the first worker to reach it writes ``parked-<step>`` and hangs;
the re-execution on the next worker finds that file and goes on.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from pydantic import BaseModel

import flowx


class Job(BaseModel):
    name: str


class JobState(BaseModel):
    a: str | None = None
    b: str | None = None
    c: str | None = None


def _dir() -> Path:
    return Path(os.environ["CRASH_DIR"])


def _park(point: str, step: str) -> None:
    flag = _dir() / f"park-{point}-{step}"
    parked = _dir() / f"parked-{step}"
    if flag.exists() and not parked.exists():
        parked.write_text(str(os.getpid()))
        time.sleep(3600)  # until SIGKILL


def _effect(ctx: flowx.StepContext, step: str) -> str:
    _park("before-effect", step)
    conn = sqlite3.connect(_dir() / "ledger.db", timeout=30, isolation_level=None)
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS ledger (instance_id TEXT, step TEXT, "
            "attempt INTEGER, idempotency_key TEXT, pid INTEGER)"
        )
        conn.execute(
            "INSERT INTO ledger VALUES (?, ?, ?, ?, ?)",
            (ctx.instance_id, step, ctx.attempt, ctx.idempotency_key, os.getpid()),
        )
    finally:
        conn.close()
    _park("after-effect", step)
    return f"{step}-done"


@flowx.capability("crash.a", version="1.0.0")
def step_a(ctx: flowx.StepContext, job: Job) -> str:
    return _effect(ctx, "a")


@flowx.capability("crash.b", version="1.0.0", idempotent=False)
def step_b(ctx: flowx.StepContext, job: Job) -> str:
    return _effect(ctx, "b")


@flowx.capability("crash.c", version="1.0.0")
def step_c(ctx: flowx.StepContext, job: Job) -> str:
    return _effect(ctx, "c")


job = (
    flowx.flow("crash.job", version="1.0.0", input=Job, state=JobState)
    .step(step_a, into="a")
    .step(step_b, into="b")
    .step(step_c, into="c")
    .build()
)

FLOWS = [job]
