"""The saga: which finished steps have something to undo, in what order, and undoing them.

When a flow fails (or times out) after effects happened, every compensable step that
finished is undone, newest effect first; each attempt is a journal row. ``flowx replay
--dry-run`` lists the same undo work from the rows alone: it uses the same ``compensable``
and ``compensation_order`` as a real run, so the two cannot drift.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from flowx import codec
from flowx.capability import Capability
from flowx.engine.failures import error_payload, exhausted
from flowx.engine.halt import Halt
from flowx.engine.history import CommitOrder, Done
from flowx.engine.nodes.children import ChildUndo, child_instance_id
from flowx.engine.run import EVENT_NAMESPACE, Run
from flowx.engine.stops import StopReached
from flowx.engine.timeouts import invoke_bounded
from flowx.plan.model import DEFAULT_COMPENSATION_RETRY, Retry, StepNode, SubFlowNode, walk
from flowx.stores.errors import FencedOut, LeaseLost
from flowx.stores.records import EventWrite, InstanceState, Outcome
from flowx.tracing import current_context

#: The event staged with a CompensationFailed transition: the alert, kept durably (SPEC §8).
COMPENSATION_FAILED_EVENT = "flowx.compensation_failed"

T = TypeVar("T")


def compensable(node: StepNode | SubFlowNode) -> bool:
    """A step with a compensation, or a sub-flow whose child has something to undo."""
    if isinstance(node, StepNode):
        return node.compensate is not None
    return node.plan is not None and any(
        isinstance(n, SubFlowNode) or (isinstance(n, StepNode) and n.compensate is not None)
        for n in walk(node.plan.body)
    )


def compensation_order(done: Iterable[T], order: Callable[[T], CommitOrder]) -> list[T]:
    """Newest effect first: the reverse of commit order (``history.CommitOrder``)."""
    return sorted(done, key=order, reverse=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class CompensationAlert:
    """Raised once when an instance ends ``CompensationFailed`` (SPEC §8): which compensation
    ran out of attempts, and what it said last. Fix the fault, then ``flowx replay``."""

    flow_id: str
    flow_version: str
    instance_id: str
    tenant_id: str | None
    step: str
    scope: str
    capability: str
    attempts: int
    last_error: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The alert as plain JSON-ready fields, for a log line, a ticket or a webhook."""
        return {
            "flow_id": self.flow_id,
            "flow_version": self.flow_version,
            "instance_id": self.instance_id,
            "tenant_id": self.tenant_id,
            "step": self.step,
            "scope": self.scope,
            "capability": self.capability,
            "attempts": self.attempts,
            "last_error": self.last_error,
        }


def alert_event(run: Run, alert: CompensationAlert, attempt: int) -> EventWrite:
    """The alert as an outbox event, staged in the commit that ends the instance."""
    return EventWrite(
        event_id=str(
            uuid.uuid5(
                EVENT_NAMESPACE,
                f"{run.instance_id}/{COMPENSATION_FAILED_EVENT}/{alert.scope}/"
                f"{alert.step}/{attempt}",
            )
        ),
        type=COMPENSATION_FAILED_EVENT,
        schema_version="1",
        partition_key=run.tenant_id,
        payload=codec.dumps(alert.as_dict()),
        trace_context=current_context(),
    )


Undo = Capability | ChildUndo


def _undo_of(run: Run, done: Done) -> tuple[Undo, Retry] | None:
    """What undoes ``done``, with its retry policy; ``None`` if nothing does."""
    node = done.node
    if not compensable(node):
        return None
    if isinstance(node, SubFlowNode):
        assert run.waits is not None  # nosec B101  # invariant: sub-flows are Durable-only
        child_id = child_instance_id(run.instance_id, done.scope, node.step_id)
        return ChildUndo(run.waits, child_id, node), DEFAULT_COMPENSATION_RETRY
    if node.compensate is not None:
        return node.compensate, node.compensate_retry
    return None


async def compensate(
    run: Run, error: dict[str, Any], *, only: Callable[[Done], bool] | None = None
) -> tuple[CompensationAlert, bool] | None:
    """Undo completed steps newest first (those ``only`` picks, if given: a replay from a
    chosen step undoes that step and later ones). Every attempt is a journal row.

    ``None`` when all are undone; otherwise the alert for the one that ran out, and
    whether its last attempt's commit already ended the instance: that row, the
    ``CompensationFailed`` transition and the alert event are one write, so the alert is
    durable exactly when the instance is terminal."""
    for done in compensation_order(run.history.done, lambda d: d.order):
        if only is not None and not only(done):
            continue
        undo = _undo_of(run, done)
        if undo is None:
            continue
        comp, policy = undo
        a = run.history.at((done.scope, done.node.step_id))
        if a.compensated:
            continue
        failures = list(a.compensation_failures)
        if exhausted(failures, policy):
            return compensation_alert(run, done, comp, failures), False
        ended = await _undo(run, done, comp, policy, failures, error)
        if ended is not None:
            return ended, True
    return None


async def _undo(
    run: Run,
    done: Done,
    comp: Undo,
    policy: Retry,
    failures: list[dict[str, Any]],
    error: dict[str, Any],
) -> CompensationAlert | None:
    """Run one compensation until it succeeds (``None``) or runs out (the alert, committed
    with the ``CompensationFailed`` transition)."""
    node = done.node
    key = (done.scope, node.step_id)
    attempt = run.history.at(key).last_attempt + 1
    while True:
        ctx = run.context(node, done.scope, attempt, step_result=done.result, compensating=True)
        run.live()
        started = time.monotonic()
        try:
            if isinstance(comp, Capability):
                # No timeout (compensations have none), but a thread cut by a drain is
                # counted stuck like a step's.
                await invoke_bounded(
                    comp,
                    ctx,
                    done.argument,
                    run.executor,
                    limit=None,
                    by_deadline=False,
                    what=f"compensation of {node.name!r} ({comp.ref})",
                    stop=run.stop_cut(by_cancel=False),
                )
            else:
                await comp.invoke(ctx, done.argument, run.executor)
        except (FencedOut, LeaseLost) as exc:  # undoing a child: this run lost its lease
            raise Halt.abort(str(exc)) from exc
        except StopReached as exc:  # R9.4: terminated mid-compensation; nothing journaled
            raise Halt.stopped(None, "", exc.request, running=True) from exc
        except Exception as exc:
            failure = error_payload(exc)
            failures.append(failure)
            row = run.row(
                node, comp, done.scope, attempt, Outcome.COMPENSATION_FAILURE, failure, ctx, started
            )
            if exhausted(failures, policy):
                alert = compensation_alert(run, done, comp, failures)
                await run.write(
                    key,
                    row,
                    snapshot=True,
                    state=InstanceState.COMPENSATION_FAILED,
                    error={**error, "compensation": alert.as_dict()},
                    events=(alert_event(run, alert, attempt),),
                )
                return alert
            await run.write(key, row)
            await run.backoff(policy.delay(len(failures)), by_cancel=False)
            attempt = run.history.at(key).last_attempt + 1
            continue
        await run.write(
            key,
            run.row(node, comp, done.scope, attempt, Outcome.COMPENSATED, "null", ctx, started),
        )
        run.executed += 1
        return None


def compensation_alert(
    run: Run, done: Done, comp: Undo, failures: list[dict[str, Any]]
) -> CompensationAlert:
    return CompensationAlert(
        flow_id=run.plan.flow_id,
        flow_version=run.plan.version,
        instance_id=run.instance_id,
        tenant_id=run.tenant_id,
        step=done.node.name,
        scope=done.scope,
        capability=comp.ref,
        attempts=len(failures),
        last_error=failures[-1],
    )
