"""``StepContext``: what a capability sees of the flow it runs in.

Clock, ids and randomness go through the context so they can be captured (R2.5): each value a
step draws is recorded on that attempt's journal row, and a later attempt of the same step
draws the recorded values first, in order — so a retried payment uses the reference its first
try generated. A value drawn by an attempt that crashed before its commit was never recorded;
the re-execution draws fresh ones.
"""

from __future__ import annotations

import random as _random
import threading
import uuid as _uuid
from datetime import datetime
from typing import Any, NamedTuple

from flowx.clock import Clock

_KINDS = ("now", "uuid", "random")
#: Guards what a context draws: a plain-def capability runs on a worker thread. One lock for
#: every context, not one each (built on every attempt, most of which draw nothing); what it
#: guards is a few list operations, never the application's code.
_DRAWS = threading.Lock()


class StepAttempt(NamedTuple):
    """Which attempt of which step of which instance a context belongs to (a tuple: one is
    built for every attempt, and a frozen dataclass costs a ``__setattr__`` per field)."""

    instance_id: str
    flow_id: str
    flow_version: str
    scope: str
    step_id: int
    step_name: str
    attempt: int
    #: How many times a replay has re-run this step after it succeeded (``history.py``).
    generation: int = 0


class StepContext:
    """Passed as the first argument to every capability.

    One is built for every attempt, most of which read little of it and draw nothing: the
    attempt's ids stay in their tuple (read through properties) and what an attempt rarely
    has — recorded draws, a compensated step's result — is set only when there is one, so the
    usual context is two attribute writes, not fourteen."""

    #: In a compensation: the result the compensated step returned (decoded JSON).
    step_result: Any = None
    #: Whether this attempt is a compensation.
    compensating: bool = False
    # What an earlier attempt of this step drew (replayed first), and what this one draws:
    # built on the first draw.
    _recorded: dict[str, list[Any]] | None = None
    _replay: dict[str, list[Any]] | None = None
    _drawn: dict[str, list[Any]] | None = None

    def __init__(
        self,
        where: StepAttempt,
        clock: Clock,
        *,
        recorded: dict[str, list[Any]] | None = None,
        step_result: Any = None,
        compensating: bool = False,
    ) -> None:
        self._where = where
        self._clock = clock
        if recorded is not None:
            self._recorded = recorded
        if step_result is not None:
            self.step_result = step_result
        if compensating:
            self.compensating = True

    @property
    def instance_id(self) -> str:
        """The instance this attempt belongs to."""
        return self._where.instance_id

    @property
    def flow_id(self) -> str:
        """The id of the flow the instance runs."""
        return self._where.flow_id

    @property
    def flow_version(self) -> str:
        """The version of that flow."""
        return self._where.flow_version

    @property
    def scope(self) -> str:
        """The step's scope: ``""`` at the top level, else the path of the for_each element
        (or fork branch) it runs in."""
        return self._where.scope

    @property
    def step_id(self) -> int:
        """The step's id in its plan."""
        return self._where.step_id

    @property
    def step_name(self) -> str:
        """The step's name in its plan."""
        return self._where.step_name

    @property
    def attempt(self) -> int:
        """1 for the first try of this step; later tries (a retry, a re-execution after a
        crash) count on from the attempts the journal holds."""
        return self._where.attempt

    @property
    def idempotency_key(self) -> str:
        """Stable across every re-execution and retry of this step of this instance (R2.5).

        Pass it to whatever performs the effect (a payment gateway's Idempotency-Key header)
        so that a re-execution after a crash is recognised downstream. A compensation has a
        key of its own. A step an operator re-ran with ``flowx replay --from`` after it had
        succeeded is a new request, so it has a new key (``…/g1``, ``…/g2``), as does its
        compensation.
        """
        generation = f"/g{self._where.generation}" if self._where.generation else ""
        suffix = ":compensate" if self.compensating else ""
        return f"{self.instance_id}/{self.scope}/{self.step_id}{generation}{suffix}"

    def _draw(self, kind: str, fresh: Any) -> Any:
        with _DRAWS:
            if self._replay is None:
                recorded = self._recorded or {}
                self._replay = {k: list(recorded.get(k, ())) for k in _KINDS}
                self._drawn = {}
            assert self._drawn is not None  # nosec B101  # invariant: made with the replay
            queue = self._replay[kind]
            value = queue.pop(0) if queue else fresh
            self._drawn.setdefault(kind, []).append(value)
            return value

    def now(self) -> datetime:
        """The current time, captured: a retry of this step sees the same instants first."""
        text = self._draw("now", self._clock.now().isoformat())
        return datetime.fromisoformat(text)

    def uuid(self) -> _uuid.UUID:
        """A random UUID, captured."""
        return _uuid.UUID(self._draw("uuid", str(_uuid.uuid4())))

    def random(self) -> float:
        """A float in [0, 1), captured."""
        value: float = self._draw("random", _random.random())  # nosec B311  # not a secret
        return value

    def drawn(self) -> dict[str, list[Any]] | None:
        """What this attempt drew, for its journal row; ``None`` if nothing."""
        drawn = self._drawn
        if not drawn:
            return None
        with _DRAWS:
            used = {k: list(drawn[k]) for k in _KINDS if k in drawn}
        return used or None
