"""The flow the PostgreSQL fault tests run: an effect the test can hold mid-step, its
compensation, and a step after it, each recorded in a ledger outside the journal.

``effect`` waits on a gate the test opens: the test arms a fault while the capability runs,
then opens the gate, so the very next journal write of that instance is ``effect``'s commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pydantic import BaseModel

import flowx
from tests.faults.support import Ledger, executes

EFFECT = "faults.gated.effect"
UNDO = "faults.gated.undo"
AFTER = "faults.gated.after"

ledger = Ledger()
#: Per instance name: set by ``effect`` once it runs; ``effect`` returns once its gate is set.
entered: dict[str, asyncio.Event] = {}
gates: dict[str, asyncio.Event] = {}


def reset() -> None:
    ledger.clear()
    entered.clear()
    gates.clear()


def hold(name: str) -> None:
    """Make the instance ``name``'s effect wait for ``gates[name]``."""
    entered[name], gates[name] = asyncio.Event(), asyncio.Event()


class Job(BaseModel):
    name: str


class JobState(BaseModel):
    effect: str | None = None
    after: str | None = None


@flowx.capability(EFFECT, version="1.0.0")
async def effect(ctx: flowx.StepContext, job: Job) -> str:
    node = ledger.record(ctx, "effect")
    if job.name in entered:
        entered[job.name].set()
        await gates[job.name].wait()
    return node  # the step's journal row names the node that ran it


@flowx.capability(UNDO, version="1.0.0")
async def undo(ctx: flowx.StepContext, job: Job) -> None:
    ledger.record(ctx, "undo")  # a compensation: no test here may see one


@flowx.capability(AFTER, version="1.0.0")
async def after(ctx: flowx.StepContext, job: Job) -> str:
    return ledger.record(ctx, "after")


FLOW = (
    flowx.flow("faults.gated", version="1.0.0", input=Job, state=JobState)
    .step(effect, into="effect", compensate=undo)
    .step(after, into="after")
    .build()
)


def commit_of(step: str) -> Callable[[bytes], bool]:
    """A proxy trap predicate: a request that executes the commit of ``step``. Only a step
    commit carries the step's name; lease renewals and releases carry ids alone."""
    needle = step.encode()

    def matches(chunk: bytes) -> bool:
        return executes(chunk) and needle in chunk

    return matches
