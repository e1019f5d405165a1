"""The step loop: run one instance of a plan, or resume it from its journal.

A fresh run and a resume are the same loop (R2.8). The loop walks the plan; at each node it
looks up the rows already committed for ``(scope, step_id)`` (``engine/history.py``). A
``Success`` row is replayed — its recorded result is applied to the state exactly as a live
result is, without calling the capability — and anything else is executed and committed. So
the frontier (what to skip) is derived from the rows, never stored.

The loop does no I/O of its own: it commits and waits through ``RunPorts``. A wait ends the
run, not the instance: the instance is sealed ``Suspended`` at its frontier and the run
returns ``suspended``, holding no task and no lease (R6.3). Whatever wakes it — a signal, its
timer, its child's end — resumes it through this same loop, on any node.

Here: the dispatcher over node kinds (``engine/nodes``), and what each way of stopping
(``engine/halt.py``) means for the instance — failing it (compensating first, through
``engine/saga.py``), suspending, yielding, or aborting.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from typing import Any, Literal

from flowx import codec
from flowx.engine.failures import DEADLINE_EXCEEDED, UNDO_FAILED, error_payload
from flowx.engine.halt import ENDING, Halt, HaltKind
from flowx.engine.nodes import children, steps, waits
from flowx.engine.nodes.children import child_instance_id
from flowx.engine.ports import Committer, RunPorts, WaitPort
from flowx.engine.run import Run
from flowx.engine.saga import CompensationAlert, compensable, compensate
from flowx.engine.spec import RunSpec
from flowx.engine.stops import CANCELLED, stop_error
from flowx.errors import FlowXError
from flowx.plan.model import (
    AwaitSignalNode,
    EmitNode,
    ForEachNode,
    ForkNode,
    Node,
    SleepNode,
    StepNode,
    SubFlowNode,
)
from flowx.plan.model import walk as walk_plan
from flowx.stores.records import InstanceState, Outcome, record

__all__ = [
    "DEADLINE_EXCEEDED",
    "Committer",
    "CompensationAlert",
    "Execution",
    "RunOutcome",
    "RunPorts",
    "RunResult",
    "RunSpec",
    "WaitPort",
    "child_instance_id",
    "compensable",
    "error_payload",
]

log = logging.getLogger("flowx.engine")

RunOutcome = Literal[
    "completed",
    "failed",
    "timed_out",
    "compensation_failed",
    "cancelled",
    "terminated",
    "aborted",
    "yielded",
    "suspended",
]

#: The state each outcome that ends the instance leaves it in.
_FINAL_STATES: dict[str, InstanceState] = {
    "completed": InstanceState.COMPLETED,
    "failed": InstanceState.FAILED,
    "timed_out": InstanceState.TIMED_OUT,
    "compensation_failed": InstanceState.COMPENSATION_FAILED,
    "cancelled": InstanceState.CANCELLED,
    "terminated": InstanceState.TERMINATED,
}


@record
class RunResult:
    """How one run of an instance ended on this node."""

    outcome: RunOutcome
    state_bag: str
    error: dict[str, Any] | None = None
    #: Why the run stopped without finishing: this node lost the right to write (R3.5).
    abort_reason: str | None = None
    executed: int = 0
    replayed: int = 0
    #: A suspended run: when its timer is due (``None``: only a signal or a child wakes it).
    wake_at: datetime | None = None
    #: A run that ended CompensationFailed: what to tell the operator.
    alert: CompensationAlert | None = None

    @property
    def final_state(self) -> InstanceState | None:
        return _FINAL_STATES.get(self.outcome)


class Execution:
    """One run of one instance on this node. Create, ``await run()``, discard.

    Raises ``NonDeterminismError`` on construction when the journal does not match the plan.
    """

    def __init__(self, spec: RunSpec, ports: RunPorts) -> None:
        self.plan = spec.plan
        self.instance_id = spec.instance_id
        self._spec = spec
        self._ports = ports
        self._run = Run(spec, ports, _walk)

    async def run(self) -> RunResult:
        """Run to the end, to a wait, or until this node loses the right to write."""
        try:
            try:
                undo_failed = await self._undo_superseded()
                if undo_failed is not None:
                    return undo_failed
                await _walk(self._run, self.plan.body, "", None, False)
            except Halt as halt:
                if halt.kind not in ENDING:
                    raise
                return await self._ended_by(halt)
            run = self._run
            if run.compensating:
                # Every step is in and nothing failed: this run undoes a finished instance
                # (a child its parent is compensating, or such an undo resumed).
                error = error_payload(
                    FlowXError(
                        f"{self.plan.ref} was undone by its parent's compensation",
                        code="flow.undone",
                    ),
                    retryable=False,
                )
                return await self._fail(self.plan.body[-1], "", error)
            if not run.completed:
                await run.transition(InstanceState.COMPLETED)
            return self._result("completed")
        except Halt as halt:
            if halt.kind is HaltKind.STOPPED:  # a terminate reached mid-compensation
                return await self._stopped(halt)
            if halt.kind is HaltKind.SUSPENDED:
                return self._result("suspended", wake_at=halt.at)
            if halt.kind is HaltKind.YIELD:
                return self._result("yielded")
            if halt.kind is not HaltKind.ABORT:
                raise
            # R3.5: another node owns this instance now. Discard, and never compensate.
            log.warning(
                "instance %s: aborting without compensation: %s", self.instance_id, halt.reason
            )
            return self._result("aborted", abort_reason=halt.reason)

    async def _undo_superseded(self) -> RunResult | None:
        """A replay from a chosen step (``flowx replay --from``): before anything re-runs,
        undo the effects still standing of that step and later ones, newest first, as the
        run that made them would have (``None``: nothing left to undo, or all undone).

        The compensation needs each step's argument and result as they were, so it runs in
        a run that sees the journal as it was before the replay (every success current, its
        state replayed up to where the instance stopped) and may run nothing forward. Its
        rows are compensations of superseded successes, so the re-run does not count them
        (``history.py``); a crash here resumes the undo from the rows. A compensation that
        runs out ends the instance ``CompensationFailed``, as any other would."""
        run = self._run
        if self._spec.replay_from is None:  # every run but a replay's: nothing to look at
            return None
        stale = run.history.stale()
        if not stale:
            return None
        nodes = {n.step_id: n for n in walk_plan(self.plan.body)}
        keys = {
            key
            for key, row in stale
            if isinstance(node := nodes.get(row.step_id), StepNode | SubFlowNode)
            and compensable(node)
        }
        if not keys:
            return None
        before = Run(
            dataclasses.replace(self._spec, replay_from=None, undo=True), self._ports, _walk
        )
        try:
            await _walk(before, self.plan.body, "", None, False)
        except Halt as halt:
            if halt.kind not in ENDING or halt.kind is HaltKind.STOPPED:
                raise
            # The walk reached where the instance had stopped: every finished step is known.
        error = error_payload(
            FlowXError(
                f"{self.plan.ref}: undoing what the steps being replayed had done",
                code=UNDO_FAILED,
            ),
            retryable=False,
        )
        ended = await compensate(before, error, only=lambda d: (d.scope, d.node.step_id) in keys)
        run.executed += before.executed
        if ended is None:
            run.history.numbered_past(before.history)
            return None
        alert, sealed = ended
        error = {**error, "compensation": alert.as_dict()}
        if not sealed:
            await before.transition(InstanceState.COMPENSATION_FAILED, error=error)
        return RunResult(
            outcome="compensation_failed",
            state_bag=codec.dumps(before.state, root="state"),
            error=error,
            executed=run.executed,
            replayed=before.replayed,
            alert=alert,
        )

    async def hand_back(self) -> bool:
        """After this run was cut mid-step (a drain's budget ran out): hand the instance back
        ``Pending`` under this run's token, as a yield at a boundary does, so a peer's next
        sweep resumes it from its last commit instead of a TTL later (R7.2). Not once the
        run was ending the instance (failing, compensating, completed): that resumes from its
        own rows. ``False`` when nothing was handed back (or the fence refused it)."""
        run = self._run
        if run.ending or run.completed or run.compensating or run.halted:
            return False
        try:
            await run.transition(InstanceState.PENDING)
        except Halt as halt:
            if halt.kind is not HaltKind.ABORT:
                raise
            return False
        return True

    async def _ended_by(self, halt: Halt) -> RunResult:
        """A halt that ends the instance: a failed node, the deadline, or a resumed
        compensation."""
        if halt.kind is HaltKind.FAILED:
            assert halt.node is not None  # nosec B101  # invariant: a FAILED halt names its node
            timed_out = halt.error.get("code") == DEADLINE_EXCEEDED
            return await self._fail(halt.node, halt.scope, halt.error, timed_out=timed_out)
        if halt.kind is HaltKind.DEADLINE:
            return await self._deadline_passed(halt)
        if halt.kind is HaltKind.STOPPED:
            return await self._stopped(halt)
        request = self._run.stop.request if self._run.stop is not None else None
        if request is not None and request.mode == "cancel":
            # Compensating for a cancel whose row was not reached again (a node kind that
            # keeps none): the request on the instance says why, and how it ends.
            return await self._fail(halt.node or self.plan.body[0], halt.scope, stop_error(request))
        # Compensating, and the failure that began it left no row to find again.
        error = error_payload(
            FlowXError(
                f"{self.plan.ref} was compensating when it was resumed",
                code="flow.compensation_resumed",
            ),
            retryable=False,
        )
        return await self._fail(halt.node or self.plan.body[0], halt.scope, error)

    async def _deadline_passed(self, late: Halt) -> RunResult:
        run = self._run
        assert late.node is not None and late.at is not None  # nosec B101  # a deadline sets both
        run.stop_forward()
        error = error_payload(
            FlowXError(
                f"{self.plan.ref} passed its deadline ({late.at.isoformat()}) "
                f"{'while' if late.running else 'before'} step {late.node.name!r}"
                f"{' ran; the attempt was cancelled' if late.running else ''}",
                code=DEADLINE_EXCEEDED,
            ),
            retryable=False,
        )
        # Journaled as that step's failure, so a resumed compensation finds why it began in
        # the rows, never by asking the clock again.
        key = (late.scope, late.node.step_id)
        attempt = run.history.of(key).last_attempt + 1
        await run.write(key, run.row(late.node, None, late.scope, attempt, Outcome.FAILURE, error))
        return await self._fail(late.node, late.scope, error, timed_out=True)

    async def _stopped(self, halt: Halt) -> RunResult:
        """R9.4: an operator's stop. A terminate ends the instance now, compensating nothing.
        A cancel is journaled as the failure of the node it reached (so a resumed run finds
        why compensation began in the rows, as for a deadline), then compensates what
        finished, and ends ``Cancelled``."""
        run = self._run
        assert halt.request is not None  # nosec B101  # invariant: a stop halt holds its request
        error = stop_error(halt.request)
        run.stop_forward()
        if halt.request.mode == "terminate":
            where = {"step": halt.node.name, "scope": halt.scope} if halt.node else {}
            error = {**error, **where}
            await run.transition(InstanceState.TERMINATED, error=error)
            return self._result("terminated", error=error)
        node = halt.node or self.plan.body[0]
        key = (halt.scope, node.step_id)
        attempt = run.history.of(key).last_attempt + 1
        await run.write(key, run.row(node, None, halt.scope, attempt, Outcome.FAILURE, error))
        return await self._fail(node, halt.scope, error)

    def _result(self, outcome: RunOutcome, **extra: Any) -> RunResult:
        run = self._run
        return RunResult(
            outcome=outcome,
            state_bag=run.encoded_state(),
            executed=run.executed,
            replayed=run.replayed,
            **extra,
        )

    async def _fail(
        self, node: Node, scope: str, failure: dict[str, Any], *, timed_out: bool = False
    ) -> RunResult:
        run = self._run
        run.stop_forward()
        error = {**failure, "step": node.name, "scope": scope}
        outcome: RunOutcome = "timed_out" if timed_out else "failed"
        final = InstanceState.TIMED_OUT if timed_out else InstanceState.FAILED
        if failure.get("code") == CANCELLED:  # R9.4: compensates like a failure, ends Cancelled
            outcome, final = "cancelled", InstanceState.CANCELLED
        if any(compensable(d.node) for d in run.history.done):
            await run.transition(InstanceState.COMPENSATING)
            ended = await compensate(run, error)
            if ended is not None:
                alert, sealed = ended
                error = {**error, "compensation": alert.as_dict()}
                if not sealed:
                    # Exhausted by rows an earlier run wrote: end it now (no event: that run
                    # died between its last attempt and this transition, before staging one).
                    await run.transition(InstanceState.COMPENSATION_FAILED, error=error)
                return self._result("compensation_failed", error=error, alert=alert)
        await run.transition(final, error=error)
        return self._result(outcome, error=error)


async def _walk(run: Run, nodes: tuple[Node, ...], scope: str, item: Any, has_item: bool) -> Any:
    """Walk ``nodes`` in ``scope``; ``item`` is the for_each element, if ``has_item``."""
    last: Any = None
    for node in nodes:
        if run.halted:
            raise Halt.halted()
        if isinstance(node, StepNode):
            last = await steps.step(run, node, scope, item, has_item)
        elif isinstance(node, EmitNode):
            last = await steps.emit(run, node, scope, item, has_item)
        elif isinstance(node, ForEachNode):
            last = await steps.for_each(run, node, scope, item, has_item)
        elif isinstance(node, ForkNode):
            last = await steps.fork(run, node, scope, item, has_item)
        elif isinstance(node, AwaitSignalNode):
            last = await waits.await_signal(run, node, scope, item, has_item)
        elif isinstance(node, SleepNode):
            last = await waits.sleep(run, node, scope)
        elif isinstance(node, SubFlowNode):
            last = await children.sub_flow(run, node, scope, item, has_item)
        else:  # pragma: no cover - every node kind the builder makes is handled above
            raise FlowXError(
                f"{node.kind} {node.name!r} is declared in {run.plan.ref}, but this "
                "release of FlowX does not execute it",
                code="flow.construct_not_supported",
            )
    return last
