"""What ``flowx replay --instance ID --from STEP`` would re-run, decided from the journal alone.

A replay never rewrites history (R2.2): it re-arms the instance (``WaitStore.rearm``) so that
rows journaled before that point stop counting, and the ordinary step loop does the rest,
journaling every try as a new attempt. Three shapes are replayable:

* ``forward`` — a ``Failed``, ``TimedOut``, ``Cancelled`` or ``Terminated`` instance re-runs
  from a chosen step: that step and every later one run again, with fresh retry budgets; the
  steps before it keep their journaled results. Effects of the re-run steps that still stand (they
  succeeded and nothing undid them) are undone first, newest first, by their compensations;
  a step with none is simply run again. The chosen step may not come after where the
  instance stopped, nor after a step whose effect the end of the instance undid (that step
  must run again too), nor before a sub-flow whose child cannot give a result again (the
  child is an instance of its own, found again by its derived id: a failed child is replayed
  first, then the parent re-runs the sub-flow and takes its result). A timed-out instance
  needs a new deadline. A forward replay whose undo ran out (``CompensationFailed``) is
  replayed forward again.
* ``compensation`` — a ``CompensationFailed`` instance re-runs the compensations still owed,
  newest first, starting with the one that ran out. Compensations that succeeded stay done.
* ``resume`` — a ``Quarantined`` instance (its journal did not match its plan) resumes from
  where it stopped, once the code it was started with runs again. Nothing re-runs that had
  finished.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from flowx import codec
from flowx.engine.failures import UNDO_FAILED
from flowx.engine.history import Attempts, History, journal_order
from flowx.engine.nodes.children import child_instance_id
from flowx.engine.saga import compensable, compensation_order
from flowx.errors import IllegalState
from flowx.plan.model import Node, Plan, StepNode, SubFlowNode, walk
from flowx.stores.records import InstanceRecord, InstanceState, Outcome, StepRecord

ReplayMode = Literal["compensation", "forward", "resume"]

#: The states a replay can re-run forward from a chosen step. A terminated instance undid
#: nothing, so its replay undoes the effects of the steps it re-runs first.
FORWARD_STATES = (
    InstanceState.FAILED,
    InstanceState.TIMED_OUT,
    InstanceState.CANCELLED,
    InstanceState.TERMINATED,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayPlan:
    """A replay: where it starts and what it will run (``--dry-run`` prints this)."""

    instance_id: str
    state: InstanceState
    mode: ReplayMode
    step: str
    step_id: int
    scope: str
    #: What will run, in order: compensations as ``"undo <step>"``, forward steps by name.
    reruns: tuple[str, ...]
    #: A forward replay: the standing effects undone before anything re-runs, newest first,
    #: as ``"undo <step>"`` (also at the head of ``reruns``).
    undo: tuple[str, ...] = ()
    #: A forward replay: the steps whose journaled results are kept, in plan order.
    kept: tuple[str, ...] = ()
    #: The deadline the instance runs under once replayed (``None``: none).
    deadline_at: datetime | None = None


def _illegal(message: str) -> IllegalState:
    return IllegalState(message)


def plan_replay(
    plan: Plan,
    record: InstanceRecord,
    steps: Sequence[StepRecord],
    from_step: str | int,
    *,
    now: datetime,
    deadline: datetime | None = None,
    children: Mapping[str, InstanceState] | None = None,
) -> ReplayPlan:
    """Check that the instance can be replayed from ``from_step``, and list what would
    re-run (``deadline``: the new one, for a forward replay; ``children``: the states of
    the children its sub-flows started, by id — ``sub_flow_children``)."""
    names = {n.step_id: n for n in walk(plan.body)}
    wanted = names.get(from_step) if isinstance(from_step, int) else plan.node_named(from_step)
    if wanted is None:
        known = ", ".join(n.name for n in walk(plan.body))
        raise _illegal(f"{plan.ref} has no step {from_step!r} (its steps: {known})")
    forward = record.state in FORWARD_STATES or _undo_ran_out(record)
    if deadline is not None and not forward:
        raise _illegal(
            f"instance {record.instance_id} is {record.state.value}: a new deadline is for "
            "replaying a Failed, TimedOut, Cancelled or Terminated instance forward"
        )
    if forward:
        return _forward(
            plan, record, steps, wanted, now=now, deadline=deadline, children=children or {}
        )
    if record.state is InstanceState.COMPENSATION_FAILED:
        return _compensation(plan, record, steps, wanted)
    if record.state is InstanceState.QUARANTINED:
        return _resume(plan, record, steps, wanted)
    raise _illegal(
        f"instance {record.instance_id} is {record.state.value}; only Failed, TimedOut, "
        "Cancelled, Terminated, CompensationFailed and Quarantined instances can be replayed"
    )


def _undo_ran_out(record: InstanceRecord) -> bool:
    """A ``CompensationFailed`` instance whose forward replay's undo ran out (before anything
    re-ran): replayed forward again. One whose own compensation ran out — after a replay or
    not — finishes compensating: re-running it forward would redo what it was undoing."""
    if record.state is not InstanceState.COMPENSATION_FAILED or record.replay_from is None:
        return False
    error = codec.loads(record.error) if record.error else None
    return isinstance(error, dict) and error.get("code") == UNDO_FAILED


def _resume(
    plan: Plan, record: InstanceRecord, steps: Sequence[StepRecord], wanted: Node
) -> ReplayPlan:
    """A quarantined instance resumes at its frontier: the first step with no current
    success (after an earlier replay, a superseded one does not count)."""
    view = History(plan, record.instance_id, steps, record.replay_sequence, record.replay_from)
    ran = {key[1] for key, a in view.attempts.items() if a.success is not None}
    left = [n for n in walk(plan.body) if n.step_id not in ran]
    frontier = left[0] if left else plan.body[-1]
    if wanted.step_id != frontier.step_id:
        raise _illegal(
            f"instance {record.instance_id} stopped before step {frontier.name!r}; replay "
            f"--from {frontier.name!r}"
        )
    return ReplayPlan(
        instance_id=record.instance_id,
        state=record.state,
        mode="resume",
        step=frontier.name,
        step_id=frontier.step_id,
        scope="",
        reruns=tuple(n.name for n in left),
    )


def _forward(
    plan: Plan,
    record: InstanceRecord,
    steps: Sequence[StepRecord],
    wanted: Node,
    *,
    now: datetime,
    deadline: datetime | None,
    children: Mapping[str, InstanceState],
) -> ReplayPlan:
    """A forward replay from ``wanted``: the journal as the re-run will see it (the same
    ``History`` index, so this listing and the run cannot drift), checked and listed."""
    iid, first = record.instance_id, wanted.step_id
    view = History(plan, iid, steps, record.next_sequence, first)
    nodes = list(walk(plan.body))
    by_id = {n.step_id: n for n in nodes}
    earlier = [(key, a) for key, a in view.attempts.items() if key[1] < first]
    # Where the instance stopped (a step that failed, timed out or was cancelled with no
    # success after), and steps whose effect its end undid: both must run again.
    must_rerun = sorted(
        key[1] for key, a in earlier if a.undoing or (a.success is None and a.failures)
    )
    if must_rerun:
        name = by_id[must_rerun[0]].name
        raise _illegal(
            f"instance {iid} cannot be replayed from {wanted.name!r}: step {name!r} before it "
            f"{_why_rerun(view, must_rerun[0])}, so it must run again too; replay --from "
            f"{name!r} (or an earlier step)"
        )
    for node in nodes:
        if isinstance(node, SubFlowNode) and node.step_id >= first:
            # The scopes it ran in, and the top level, where a child may have been started
            # with no row yet (its parent stopped while waiting for it).
            scopes = {key[0] for key in view.attempts if key[1] == node.step_id} | {""}
            for scope in sorted(scopes):
                a = view.of((scope, node.step_id))
                _child_rerunnable(iid, wanted, node, (scope, node.step_id), a, children)
    if record.deadline_at is not None and deadline is None and record.deadline_at <= now:
        raise _illegal(
            f"instance {iid} passed its deadline ({record.deadline_at.isoformat()}); give "
            "the replay a new one (--deadline 1h, or deadline= in the API)"
        )
    undo = tuple(
        f"undo {row.step_name}" + (f" [{row.scope}]" if row.scope else "")
        for key, row in sorted(view.stale(), key=lambda kv: kv[1].sequence, reverse=True)
        if isinstance(n := by_id.get(key[1]), StepNode | SubFlowNode) and compensable(n)
    )
    kept_ids = {key[1] for key, a in earlier if a.success is not None}
    return ReplayPlan(
        instance_id=iid,
        state=record.state,
        mode="forward",
        step=wanted.name,
        step_id=first,
        scope="",
        reruns=undo + tuple(n.name for n in nodes if n.step_id not in kept_ids),
        undo=undo,
        kept=tuple(n.name for n in nodes if n.step_id in kept_ids),
        deadline_at=deadline or record.deadline_at,
    )


def _child_rerunnable(
    iid: str,
    wanted: Node,
    node: SubFlowNode,
    key: tuple[str, int],
    a: Attempts,
    children: Mapping[str, InstanceState],
) -> None:
    """A sub-flow re-run by a replay finds the child it started (its id is derived from
    where it starts, so a parent never starts a second one): it can only take that child's
    result. So the child must have completed — replayed by the operator after it failed —
    and must not have completed before, as the replay would undo it and then find it undone."""
    child_id = child_instance_id(iid, key[0], key[1])
    state = children.get(child_id)
    if not a.last_attempt and state is None:
        return  # never started: the re-run starts it
    if a.stale is not None:
        raise _illegal(
            f"instance {iid} cannot be replayed from {wanted.name!r}: sub-flow {node.name!r} "
            f"after it completed its child instance {child_id}, which cannot run again; "
            "replay this instance from a step after the sub-flow"
        )
    if state is not InstanceState.COMPLETED:
        ended = state.value if state is not None else "missing from the journal"
        raise _illegal(
            f"instance {iid} cannot be replayed from {wanted.name!r}: sub-flow {node.name!r} "
            f"re-runs by taking the result of its child instance {child_id}, which is "
            f"{ended}; replay the child first (flowx replay --instance {child_id} --from "
            "<step>), then this instance"
        )


def sub_flow_children(plan: Plan, instance_id: str, steps: Sequence[StepRecord]) -> list[str]:
    """The ids of the children this instance's sub-flows started: what a forward replay's
    check needs the states of (``children`` of ``plan_replay``)."""
    sub_flows = {n.step_id for n in walk(plan.body) if isinstance(n, SubFlowNode)}
    started = {
        child_instance_id(instance_id, r.scope, r.step_id) for r in steps if r.step_id in sub_flows
    }
    # A child started with no row in its parent yet (the parent stopped while it waited):
    # at the top level its id is known without one.
    top = {
        child_instance_id(instance_id, "", n.step_id)
        for n in plan.body
        if isinstance(n, SubFlowNode)
    }
    return sorted(started | top)


def _why_rerun(view: History, step_id: int) -> str:
    """What happened to a step before the chosen one that makes it run again."""
    undone = any(a.undoing for key, a in view.attempts.items() if key[1] == step_id)
    return "was undone when the instance ended" if undone else "is where the instance stopped"


def _compensation(
    plan: Plan, record: InstanceRecord, steps: Sequence[StepRecord], wanted: Node
) -> ReplayPlan:
    """A ``CompensationFailed`` instance re-runs the compensations still owed, starting with
    the one that ran out: ``wanted`` must name it."""
    last = next((r for r in reversed(steps) if r.outcome is Outcome.COMPENSATION_FAILURE), None)
    if last is None:  # a compensation exhausted with no row: impossible, but say so
        raise _illegal(f"instance {record.instance_id} has no failed compensation to replay")
    if wanted.step_id != last.step_id:
        raise _illegal(
            f"instance {record.instance_id} stopped compensating at step "
            f"{last.step_name!r}; replay --from {last.step_name!r}"
        )
    # What a real run's compensation would undo, in the order it would: the journal as the
    # run will index it (the current success of each step, after any earlier replay), and
    # the same ``compensable`` and ``compensation_order`` (``engine/saga.py``).
    view = History(plan, record.instance_id, steps, record.next_sequence)
    nodes = {n.step_id: n for n in walk(plan.body)}
    owed = compensation_order(
        (
            a.success
            for key, a in view.attempts.items()
            if a.success is not None
            and not a.compensated
            and isinstance(node := nodes.get(key[1]), StepNode | SubFlowNode)
            and compensable(node)
        ),
        journal_order,
    )
    return ReplayPlan(
        instance_id=record.instance_id,
        state=record.state,
        mode="compensation",
        step=last.step_name,
        step_id=last.step_id,
        scope=last.scope,
        reruns=tuple(f"undo {r.step_name}" + (f" [{r.scope}]" if r.scope else "") for r in owed),
    )
