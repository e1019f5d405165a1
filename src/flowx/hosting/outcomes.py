"""What follows a run on this node, whichever way the instance came to run.

The engine decides an outcome; the node acts on it: arm the timer service for a wait sealed
here, raise the alert for a compensation that ran out (SPEC §8), count a deadline, wake the
parent of a child that ended, and — when a drain cut a run — hand the instance back
``Pending`` (R7.2).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from flowx.engine.runner import Execution, RunResult
from flowx.hosting.context import NodeContext
from flowx.hosting.timers import TimerService
from flowx.metrics import (
    COMPENSATION_FAILED,
    DEADLINE_EXCEEDED,
    FLOWS_ENDED,
    TAKEOVER_DELAY_SECONDS,
    TAKEOVERS,
    TIMER_LATENESS_SECONDS,
)
from flowx.plan.model import Plan
from flowx.stores.records import InstanceRecord, InstanceState
from flowx.tracing import annotate, span

log = logging.getLogger("flowx.host")


async def after_run(
    ctx: NodeContext,
    plan: Plan,
    record: InstanceRecord,
    result: RunResult,
    *,
    timers: TimerService | None,
    wake: Callable[[str], None] | None,
    counted: bool = True,
) -> None:
    """Arm the timer for a wait sealed here, raise the alert for a compensation that ran
    out, and (with ``wake``) wake the parent of a child that ended. ``counted=False``: an
    undo of a completed child, whose end was counted when it completed."""
    if result.outcome == "suspended" and timers is not None:
        timers.poke()
    elif result.outcome == "compensation_failed" and result.alert is not None:
        COMPENSATION_FAILED.inc(plan.flow_id)
        try:
            await ctx.alerts.compensation_failed(result.alert)
        except Exception:
            log.exception(
                "the alert sink failed for instance %s; the alert is also in the outbox "
                "as a flowx.compensation_failed event",
                record.instance_id,
            )
    elif result.outcome == "timed_out":
        DEADLINE_EXCEEDED.inc(plan.flow_id)
    if result.final_state is not None and counted:
        FLOWS_ENDED.inc((plan.flow_id, result.outcome))
    if result.outcome in ENDED_BADLY:
        log_outcome(plan, record, result)
    parent = record.parent_instance_id
    if wake is not None and result.final_state is not None and parent is not None:
        # The child's last commit already made the parent Pending (durably); resuming it
        # here only saves the wait for a recovery sweep. Its own task: this lease is
        # released first.
        wake(parent)


def run_span(plan: Plan, record: InstanceRecord) -> AbstractContextManager[Any]:
    """The span of one run of ``record`` on this node: in the trace its start began
    (``trace_context``), whichever node started it (``flowx.tracing``)."""
    return span(
        "flowx.run",
        {
            "flow": plan.flow_id,
            "version": plan.version,
            "instance": record.instance_id,
            "tenant": record.tenant_id,
        },
        parent=record.trace_context,
        # An instance started untraced (before tracing, or by a process with no SDK) is a
        # trace of its own, never a child of whatever the task that runs it inherited.
        root=True,
    )


def taken_over(record: InstanceRecord, now: datetime) -> None:
    """Measure a resume as it was read before this node took it (``flowx.metrics``): a due
    timer's lateness, or — an instance some node was running — a takeover and how long it
    sat since its last write. A queued (``Pending``) instance is neither."""
    if record.state is InstanceState.SUSPENDED and record.wake_at is not None:
        if record.wake_at <= now:
            late = (now - record.wake_at).total_seconds()
            TIMER_LATENESS_SECONDS.observe(record.flow_id, late)
            # The wake-up, in the instance's trace, with how late it came (``flowx.tracing``).
            attrs = {"flow": record.flow_id, "instance": record.instance_id, "step_id": None}
            with span("flowx.timer_wake", attrs, parent=record.trace_context) as woke:
                annotate(woke, late_ms=int(late * 1000), step_id=record.wake_step_id)
    elif record.state in (InstanceState.RUNNING, InstanceState.COMPENSATING):
        TAKEOVERS.inc(record.flow_id)
        idle = max((now - record.updated_at).total_seconds(), 0.0)
        TAKEOVER_DELAY_SECONDS.observe(record.flow_id, idle)


#: Outcomes an operator hears of: one log line each, with the facts as fields.
ENDED_BADLY = frozenset({"failed", "timed_out", "compensation_failed", "cancelled", "terminated"})


def log_outcome(plan: Plan, record: InstanceRecord, result: RunResult) -> None:
    """One line for an instance that ended other than completed: flow, version, instance,
    step, error code (and who, for a cancel or terminate). ``--log-format json`` carries each
    as a field of its own."""
    error = result.error or {}
    fields = {
        "flow": plan.flow_id,
        "version": plan.version,
        "instance": record.instance_id,
        "outcome": result.outcome,
        "step": error.get("step"),
        "error_code": error.get("code"),
    }
    who = f" by {error.get('by')}" if error.get("by") else ""
    log.log(
        logging.INFO if result.outcome in ("cancelled", "terminated") else logging.WARNING,
        "instance %s of %s@%s ended %s%s at step %r (%s): %s",
        record.instance_id,
        plan.flow_id,
        plan.version,
        result.outcome,
        who,
        error.get("step"),
        error.get("code"),
        error.get("reason") or error.get("message"),
        extra=fields,
    )


async def hand_back(execution: Execution, instance_id: str, timeout: float) -> None:
    """A run the drain cut: hand its instance back ``Pending`` (bounded; best effort — if it
    fails, the released lease still lets recovery take it, one TTL after its last write)."""
    try:
        handed = await asyncio.wait_for(execution.hand_back(), timeout=timeout)
    except Exception as exc:
        log.warning("drain: instance %s not handed back (%s); recovery takes it", instance_id, exc)
        return
    if handed:
        log.info("drain: instance %s cut mid-step and handed back Pending", instance_id)
