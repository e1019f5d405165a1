"""``flowx replay``: check a replay against the journal, then re-arm the instance under its
lease so the ordinary step loop re-runs it (``engine/replay_plan.py`` decides what re-runs).

Kept apart from the host and the instance runner: a replay is an operator's act on one
instance, not part of running work, and it needs only a lease and one fenced write.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from flowx.engine.replay_plan import ReplayPlan, plan_replay, sub_flow_children
from flowx.errors import FlowXError, IllegalState, RequestInvalid
from flowx.hosting.context import NodeContext
from flowx.hosting.instance_runner import InstanceRunner
from flowx.plan.model import Plan
from flowx.stores.records import InstanceRecord, InstanceState


async def planned(
    ctx: NodeContext,
    plan: Plan,
    record: InstanceRecord,
    from_step: str | int,
    deadline: datetime | timedelta | None,
) -> tuple[ReplayPlan, datetime | None]:
    """What a replay of ``record`` from ``from_step`` would run, and the deadline it would
    run under (a duration is counted from now). Raises ``RequestInvalid`` for a deadline
    already past, ``IllegalState`` for a replay the journal does not allow."""
    now = ctx.clock.now()
    if isinstance(deadline, timedelta):
        deadline = now + deadline
    if deadline is not None and deadline <= now:
        raise RequestInvalid(
            f"the replay's deadline {deadline.isoformat()} has already passed; give a later one"
        )
    journal = ctx.require_stores().journal
    steps = await journal.steps(record.instance_id)
    children: dict[str, InstanceState] = {}
    for child_id in sub_flow_children(plan, record.instance_id, steps):
        child = await journal.get(child_id)
        if child is not None:
            children[child_id] = child.state
    target = plan_replay(
        plan, record, steps, from_step, now=now, deadline=deadline, children=children
    )
    return target, deadline


async def rearm(
    ctx: NodeContext,
    runner: InstanceRunner,
    record: InstanceRecord,
    target: ReplayPlan,
    deadline: datetime | None,
) -> None:
    """Re-arm ``record``'s instance for ``target`` under its lease; the caller resumes it
    after. Refused when another node holds it or it moved since it was read."""
    stores = ctx.require_stores()
    instance_id = record.instance_id
    ending = runner.tasks.get(instance_id)
    if ending is not None:
        # This node's own run of it has given its outcome and is releasing its lease: wait
        # for that rather than refuse (never cancelled by this wait).
        await asyncio.wait([ending])
    claimed = await runner.claim(stores, record)
    if claimed is None:
        raise FlowXError(
            f"instance {instance_id} is held by another node right now; retry",
            code="instance.busy",
        )
    durable, current = claimed
    try:
        moved = current.instance
        if moved.state is not record.state or moved.next_sequence != record.next_sequence:
            # What was checked (and listed by a dry run) is no longer the journal.
            raise IllegalState(
                f"instance {instance_id} moved on meanwhile (now {moved.state.value}); "
                "check it again and replay"
            )
        await stores.waits.rearm(
            instance_id,
            token=durable.token,
            now=ctx.clock.now(),
            from_step=target.step_id,
            rerun_from=target.step_id if target.mode == "forward" else None,
            deadline=deadline,
            resume=target.mode == "resume",
        )
    finally:
        await durable.release()
