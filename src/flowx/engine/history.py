"""The journal of one instance, indexed for the step loop.

The loop never stores a frontier: at each node it asks this index what the rows already say
about ``(scope, step_id)`` — a success to replay, failures that count against the retry
budget, a compensation done — and it feeds its own commits back in, so the index is always
"the journal as of now". Replay bookkeeping (``flowx replay`` resets budgets from a sequence
on) and the non-determinism check (a row whose step the plan names differently) live here too,
because both are facts about rows, not about running anything.

A replay from a chosen step (``replay_from``) re-runs that step and every later one without
touching a row (R2.2): rows of those steps journaled before the replay are *superseded*.
They still number attempts (a new row never reuses a key), but a superseded success is not
replayed — it is *stale*, and its effect, if it still stands, is undone before anything
re-runs — and superseded failures no longer count against a budget. Each time a step's
success is superseded its *generation* rises, and so does its idempotency key, so a re-run
is a new request downstream rather than the old one recognised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flowx import codec
from flowx.errors import NonDeterminismError
from flowx.plan.model import AwaitSignalNode, Plan, StepNode, SubFlowNode, walk
from flowx.stores.records import Outcome, StepRecord, StepWrite, blank

#: Commit order of a step: ``(0, sequence)`` for a journaled row, ``(1, n)`` for this run's
#: n-th commit. Compensation runs in reverse of it, which is the order the effects happened
#: in even when fork branches replay in another interleaving.
CommitOrder = tuple[int, int]

#: Read once: on CPython 3.11 each read of an enum class's member passes through its
#: metaclass's ``__getattr__`` hook (a few times a dict lookup), and this is the step path.
_SUCCESS = Outcome.SUCCESS


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
    #: How many of this step's successes are no longer current (a replay re-ran it): part of
    #: its idempotency key, so a re-run is not taken downstream for the run it replaces.
    generation: int = 0
    #: A replay from a chosen step: the success it superseded, and whether its effect was
    #: undone (by the compensation that ended the instance, or by the replay itself).
    stale: StepRecord | None = None
    stale_undone: bool = False
    #: A forward row (success or failure) written since the replay began.
    fresh: bool = False
    #: A compensation row (either outcome) of the current success: its undo has begun.
    undoing: bool = False


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


_COMPENSATION = (Outcome.COMPENSATED, Outcome.COMPENSATION_FAILURE)


#: What ``History.of`` gives for a key nothing is known about; never written to.
_NOTHING_YET = Attempts()


class History:
    """Attempts per ``(scope, step_id)``, consumed signal seqs, and the finished steps."""

    def __init__(
        self,
        plan: Plan,
        instance_id: str,
        rows: Sequence[StepRecord],
        replay_sequence: int | None,
        replay_from: int | None = None,
    ) -> None:
        self.attempts: dict[tuple[str, int], Attempts] = {}
        #: Inbox seqs of the signals each wait has already taken, by signal name.
        self.consumed: dict[str, set[int]] = {}
        #: Finished steps, for compensation (``saga.compensation_order`` sorts them).
        self.done: list[Done] = []
        # A replay (``flowx replay``) gives retry budgets afresh from ``replay_sequence`` on:
        # the compensation's, when compensation had begun; otherwise the failed step's.
        self.replay_sequence = replay_sequence
        # A replay from a chosen step: rows of that step and later ones, journaled before
        # the replay, are superseded (see the module docstring).
        self.replay_from = replay_from if replay_sequence is not None else None
        self.forward_replay = (
            replay_sequence is not None and replay_from is None and not compensation_began(rows)
        )
        nodes = {n.step_id: n for n in walk(plan.body)} if rows else {}
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
            current = self._absorb(
                (row.scope, row.step_id),
                row.attempt,
                row.outcome,
                row.result,
                row.nondeterministic,
                row.capability_version,
                row,
            )
            # A wait re-run by a replay takes the signal it took before again (it is still
            # in the inbox): the re-run sees the inputs the run it replaces saw.
            if (
                current
                and isinstance(node, AwaitSignalNode)
                and row.outcome is Outcome.SUCCESS
                and (taken := codec.loads(row.result).get("seq")) is not None
            ):
                self.consumed.setdefault(node.signal, set()).add(int(taken))
        # Whether the current generation of any step has been (or is being) undone: a
        # compensation of a superseded success does not count, nor one a re-run replaced.
        self.compensation_began = any(a.undoing for a in self.attempts.values())

    def of(self, key: tuple[str, int]) -> Attempts:
        """What is known about ``key`` (empty if nothing is), without recording it: to read
        only, as an unknown key gives one shared empty entry (asked twice for every step)."""
        return self.attempts.get(key) or _NOTHING_YET

    def at(self, key: tuple[str, int]) -> Attempts:
        """What is known about ``key``, recorded so later commits add to the same entry."""
        return self.attempts.setdefault(key, Attempts())

    def committed(self, key: tuple[str, int], step: StepWrite) -> None:
        """This run's own commit, absorbed as a row would be. The step commit's usual case —
        the first success of a step, no replay from a chosen step under way — is what
        ``_absorb`` makes of it, made directly."""
        if step.outcome is _SUCCESS and self.replay_from is None and key not in self.attempts:
            fresh = blank(Attempts)  # one per step: built as ``blank`` says, without a dict
            Attempts.__init__(
                fresh, last_attempt=step.attempt, capability_version=step.capability_version
            )
            self.attempts[key] = fresh
            return
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

    def stale(self) -> list[tuple[tuple[str, int], StepRecord]]:
        """Superseded successes whose effect still stands, oldest first: what a replay from a
        chosen step must undo before it re-runs anything."""
        found = [
            (key, a.stale)
            for key, a in self.attempts.items()
            if a.stale is not None and not a.stale_undone and not a.fresh
        ]
        return sorted(found, key=lambda kv: kv[1].sequence)

    def numbered_past(self, other: History) -> None:
        """Attempts numbered on from ``other``'s: rows a run wrote before this index was
        built from the journal (a replay's undo, before its re-run) still own their keys."""
        for key, theirs in other.attempts.items():
            mine = self.at(key)
            mine.last_attempt = max(mine.last_attempt, theirs.last_attempt)

    def _absorb(
        self,
        key: tuple[str, int],
        attempt: int,
        outcome: Outcome,
        result: str,
        drawn: str | None,
        version: str | None,
        row: StepRecord | None,
    ) -> bool:
        """Index one row; ``False`` when a replay superseded it."""
        a = self.at(key)
        a.last_attempt = max(a.last_attempt, attempt)
        if self._superseded(key, a, outcome, row):
            # A re-run keeps the capability version the step first ran with (R2.6).
            if outcome is Outcome.SUCCESS:  # no longer current: the re-run is a new one
                a.stale, a.stale_undone = row, False
                a.generation += 1
                a.capability_version = version
            elif outcome is Outcome.FAILURE:
                a.capability_version = a.capability_version or version
            elif outcome is Outcome.COMPENSATED:
                a.stale_undone = True
            return False
        if outcome is Outcome.SUCCESS and (a.success is not None or a.compensated):
            # A replay re-ran this step (an earlier view superseded this success's
            # predecessor): the new success starts a generation of its own.
            a.generation += 1
            a.compensated, a.compensation_failures, a.undoing = False, [], False
        if outcome in _COMPENSATION:
            a.undoing = True
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
        return True

    def _superseded(
        self, key: tuple[str, int], a: Attempts, outcome: Outcome, row: StepRecord | None
    ) -> bool:
        """Whether a row of ``key`` belongs to what a replay from a chosen step re-runs:
        journaled before the replay, or a compensation undoing such a row (written by the
        replay before any new forward row of its step)."""
        if self.replay_from is None or key[1] < self.replay_from:
            return False
        if row is not None and self.replay_sequence is not None:
            if row.sequence < self.replay_sequence:
                return True
            if outcome in _COMPENSATION and not a.fresh:
                return True
        if outcome not in _COMPENSATION:
            a.fresh = True
        return False
