"""The journal of one instance, indexed for the step loop.

The loop never stores a frontier: at each node it asks this index what the rows already say
about ``(scope, step_id)`` — a success to replay, failures that count against the retry
budget, a compensation done — and it feeds its own commits back in, so the index is always
"the journal as of now". Replay bookkeeping (``flowx replay`` resets budgets from a sequence
on) and the non-determinism check (a row whose step the plan names differently) live here too,
because both are facts about rows, not about running anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flowx import codec
from flowx.errors import NonDeterminismError
from flowx.plan.model import AwaitSignalNode, Plan, StepNode, SubFlowNode, walk
from flowx.stores.records import Outcome, StepRecord, StepWrite

#: Commit order of a step: ``(0, sequence)`` for a journaled row, ``(1, n)`` for this run's
#: n-th commit. Compensation runs in reverse of it, which is the order the effects happened
#: in even when fork branches replay in another interleaving.
CommitOrder = tuple[int, int]


def journal_order(row: StepRecord) -> CommitOrder:
    """Where a journaled row sits in commit order (before anything this run commits)."""
    return (0, row.sequence)


@dataclass(kw_only=True, slots=True)
class Attempts:
    """What the journal (plus this run's own commits) says about one ``(scope, step_id)``."""

    last_attempt: int = 0
    success: StepRecord | None = None
    failures: list[dict[str, Any]] = field(default_factory=list)
    last_failure_drawn: dict[str, list[Any]] | None = None
    compensated: bool = False
    compensation_failures: list[dict[str, Any]] = field(default_factory=list)
    capability_version: str | None = None


@dataclass(kw_only=True, slots=True)
class Done:
    """A finished step (or sub-flow), kept so the saga can undo it."""

    node: StepNode | SubFlowNode
    scope: str
    argument: Any
    result: Any
    order: CommitOrder = (0, 0)


def compensation_began(rows: Sequence[StepRecord]) -> bool:
    return any(r.outcome in (Outcome.COMPENSATED, Outcome.COMPENSATION_FAILURE) for r in rows)


class History:
    """Attempts per ``(scope, step_id)``, consumed signal seqs, and the finished steps."""

    def __init__(
        self,
        plan: Plan,
        instance_id: str,
        rows: Sequence[StepRecord],
        replay_sequence: int | None,
    ) -> None:
        self.attempts: dict[tuple[str, int], Attempts] = {}
        #: Inbox seqs of the signals each wait has already taken, by signal name.
        self.consumed: dict[str, set[int]] = {}
        #: Finished steps, for compensation (``saga.compensation_order`` sorts them).
        self.done: list[Done] = []
        # A replay (``flowx replay``) gives retry budgets afresh from ``replay_sequence`` on:
        # the compensation's, when compensation had begun; otherwise the failed step's.
        self.replay_sequence = replay_sequence
        self.compensation_began = compensation_began(rows)
        self.forward_replay = replay_sequence is not None and not self.compensation_began
        nodes = {n.step_id: n for n in walk(plan.body)}
        for row in rows:
            node = nodes.get(row.step_id)
            expected = node.name if node is not None else None
            if expected != row.step_name:
                raise NonDeterminismError(
                    f"instance {instance_id} has a journal row for step {row.step_id} "
                    f"named {row.step_name!r}, but {plan.ref} names that step "
                    f"{expected!r}; a running instance's plan changed without a new version. "
                    "Deploy the old version beside the new one until its instances finish"
                )
            if (
                isinstance(node, AwaitSignalNode)
                and row.outcome is Outcome.SUCCESS
                and (taken := codec.loads(row.result).get("seq")) is not None
            ):
                self.consumed.setdefault(node.signal, set()).add(int(taken))
            self._absorb(
                (row.scope, row.step_id),
                row.attempt,
                row.outcome,
                row.result,
                row.nondeterministic,
                row.capability_version,
                row,
            )

    def of(self, key: tuple[str, int]) -> Attempts:
        """What is known about ``key`` (empty if nothing is), without recording it."""
        return self.attempts.get(key) or Attempts()

    def at(self, key: tuple[str, int]) -> Attempts:
        """What is known about ``key``, recorded so later commits add to the same entry."""
        return self.attempts.setdefault(key, Attempts())

    def committed(self, key: tuple[str, int], step: StepWrite) -> None:
        """This run's own commit, absorbed as a row would be."""
        self._absorb(
            key,
            step.attempt,
            step.outcome,
            step.result,
            step.nondeterministic,
            step.capability_version,
            None,
        )

    def keep(self, done: Done) -> None:
        """Remember a finished step for compensation."""
        self.done.append(done)

    def _absorb(
        self,
        key: tuple[str, int],
        attempt: int,
        outcome: Outcome,
        result: str,
        drawn: str | None,
        version: str | None,
        row: StepRecord | None,
    ) -> None:
        a = self.at(key)
        a.last_attempt = max(a.last_attempt, attempt)
        before_replay = (
            row is not None
            and self.replay_sequence is not None
            and row.sequence < self.replay_sequence
        )
        if outcome is Outcome.SUCCESS:
            a.success = row
            a.capability_version = version
        elif outcome is Outcome.FAILURE:
            if not (before_replay and self.forward_replay):
                a.failures.append(codec.loads(result))
            a.last_failure_drawn = codec.loads(drawn) if drawn else None
            a.capability_version = a.capability_version or version
        elif outcome is Outcome.COMPENSATED:
            a.compensated = True
        elif not before_replay:
            a.compensation_failures.append(codec.loads(result))
