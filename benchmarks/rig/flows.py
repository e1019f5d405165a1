"""The rig's flow, imported by real ``flowx worker`` processes (``--flows benchmarks.rig.flows``).

Every step is the non-idempotent capability ``chaos.effect``: it records one effect in the
ledger table — outside the journal, in a schema of its own — and returns the effect's id, so the
journal row of the step says which effect it committed. An effect whose id no journal row holds
is one whose commit never landed: a duplicate when its step ran again.

The controller *arms* a worker by writing ``arm-<pid>.json`` in the run directory and sending
SIGUSR1. The next step that worker runs (of one instance, if the arm names it) parks: it writes
``parked-<pid>-<n>.json`` and waits ``hold`` seconds, at a chosen point —

- ``after_effect``: the effect is in the ledger and the step has not returned, so not committed;
- ``before_effect``: the previous step's commit has landed and this step has done nothing yet.

With ``before_last`` set, the last step of a flow does not take the arm (its commit ends the
instance, so a fault there leaves nothing to take over). The controller then kills, stops or
lets go of the process, knowing exactly where it stood.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
import uuid
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import BaseModel

import flowx

STEPS = 4
INSERT = (
    "INSERT INTO ledger (effect_id, instance_id, step_id, pid) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (effect_id) DO NOTHING"
)

_arm: dict[str, Any] | None = None
_parks = 0
_pool: Any = None


class Order(BaseModel):
    n: int


class OrderState(BaseModel):
    s1: str | None = None
    s2: str | None = None
    s3: str | None = None
    s4: str | None = None


def _run_dir() -> Path:
    return Path(os.environ["CHAOS_DIR"])


def _on_arm(signum: int, frame: FrameType | None) -> None:
    global _arm
    try:
        _arm = json.loads((_run_dir() / f"arm-{os.getpid()}.json").read_text())
    except (OSError, ValueError):
        _arm = None


if "CHAOS_DIR" in os.environ:
    signal.signal(signal.SIGUSR1, _on_arm)


def _take_arm(phase: str, ctx: flowx.StepContext) -> dict[str, Any] | None:
    """The arm, if it fires here. No await in between: one step takes it, never two."""
    global _arm
    arm = _arm
    if arm is None or arm.get("phase") != phase:
        return None
    if arm.get("instance") not in (None, ctx.instance_id):
        return None
    if arm.get("before_last") and ctx.step_id >= STEPS:
        return None  # the last step's commit completes the instance: nothing to take over
    _arm = None
    return arm


async def _park(arm: dict[str, Any], ctx: flowx.StepContext, phase: str) -> None:
    global _parks
    _parks += 1
    note = {
        "pid": os.getpid(),
        "instance_id": ctx.instance_id,
        "step_id": ctx.step_id,
        "phase": phase,
        "at": time.time(),
    }
    path = _run_dir() / f"parked-{os.getpid()}-{_parks}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(note))
    tmp.rename(path)  # the controller never reads half a note
    await asyncio.sleep(float(arm.get("hold", 3600)))


async def _ledger() -> Any:
    global _pool
    if _pool is None:
        from psycopg_pool import AsyncConnectionPool

        _pool = AsyncConnectionPool(
            os.environ["CHAOS_LEDGER_DSN"],
            min_size=1,
            max_size=8,
            kwargs={"autocommit": True},
            open=False,
        )
        await _pool.open()
    return _pool


async def _record(ctx: flowx.StepContext) -> str:
    """Insert the effect, retrying through a database outage: the effect system is not the
    journal, and a step must not fail because the journal's server restarted. The id is fixed
    before the first try, so a retried insert never counts twice."""
    import psycopg
    from psycopg_pool import PoolTimeout

    effect = str(uuid.uuid4())
    deadline = time.monotonic() + 300
    while True:
        try:
            pool = await _ledger()
            async with pool.connection() as conn:
                await conn.execute(INSERT, (effect, ctx.instance_id, ctx.step_id, os.getpid()))
            return effect
        except (psycopg.OperationalError, PoolTimeout):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


@flowx.capability("chaos.effect", version="1.0.0", idempotent=False)
async def effect(ctx: flowx.StepContext, order: Order) -> str:
    lo, hi = (float(x) for x in os.environ.get("CHAOS_WORK_MS", "20,80").split(","))
    await asyncio.sleep(random.uniform(lo, hi) / 1000)
    arm = _take_arm("before_effect", ctx)
    if arm is not None:
        await _park(arm, ctx, "before_effect")
    effect_id = await _record(ctx)
    arm = _take_arm("after_effect", ctx)
    if arm is not None:
        await _park(arm, ctx, "after_effect")
    return effect_id


order = (
    flowx.flow("chaos.order", version="1.0.0", input=Order, state=OrderState)
    .step(effect, name="s1", into="s1")
    .step(effect, name="s2", into="s2")
    .step(effect, name="s3", into="s3")
    .step(effect, name="s4", into="s4")
    .build()
)

FLOWS = [order]
