"""The step commit, the hot path: one statement, one round trip, and group commit (R6.2).

``COMMIT`` is a single commit: it locks the instance row, checks the fence, inserts the step
row at ``next_sequence``, moves the instance and stages the outbox rows, or does none of it
(R2.3, R2.4).

``COMMIT_BATCH`` is many instances' commits in one statement.

Commits arrive one per instance at a time (the engine awaits each), so a batch never holds two
commits of one instance under a correct lease; the batcher still defers a second one to the
next batch, because two rows for one instance in one UPDATE would apply only one of them.

The batched statement locks the instances in id order (so two nodes' batches cannot deadlock
on each other), checks each token against its instance's fence, and writes only the rows that
pass: one commit refused by its fence leaves the rest of the batch untouched. If the batch
fails as a whole because of what one commit holds (a duplicate step row, a value PostgreSQL or
the driver refuses, a deadlock), every commit in it is retried alone, so each gets its own
exact outcome and only the culprit fails (R9.5). A lost connection fails the batch as a whole:
its outcome is unknown, and recovery re-reads the journal before anything re-runs.

At low load a commit goes out at once, alone; batches form only while earlier ones are in
flight, which is exactly when waiting costs nothing.

Every array parameter of this store's statements is sent in binary (``%(name)b``, here and in
the other batched statements): psycopg writes a list in text format element by element, each
string matched by a regular expression for quoting — about 3.5× the client CPU of binary for
a 28-commit batch (``benchmarks/array_params.py``), CPU the engine shares with the rest of
the run. The values are the same; ``NULL`` elements and empty arrays go through unchanged.
Each column is a typed list (``arrays.py``), written in binary by FlowX in one pass rather than
element by element through psycopg's generic list dumper.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from operator import attrgetter
from typing import Any, Final, LiteralString

import psycopg

from flowx.stores.errors import DuplicateStep, FencedOut, UnknownInstance
from flowx.stores.postgres.arrays import BigInts, Bools, Ints, Texts, Times
from flowx.stores.postgres.batching import Batcher
from flowx.stores.postgres.database import DedicatedConnection, PostgresDatabase
from flowx.stores.records import StepCommit

# The step commit, one statement. `inst` locks the row (primary key); `ok` is empty when the
# token is below the fence, and then no other part writes anything.
COMMIT: Final[LiteralString] = """
WITH inst AS (
    SELECT fence, next_sequence FROM flow_instance
     WHERE instance_id = %(instance_id)s FOR UPDATE
), ok AS (
    SELECT next_sequence AS seq, coalesce(%(now)s::timestamptz, now()) AS now
      FROM inst WHERE %(token)s >= fence
), step AS (
    INSERT INTO flow_step (instance_id, scope, step_id, attempt, sequence, step_name, outcome,
                           result, capability_id, capability_version, nondeterministic,
                           duration_ms, committed_at, node_id)
    SELECT %(instance_id)s::uuid, %(scope)s::text, %(step_id)s::int, %(attempt)s::int, ok.seq,
           %(step_name)s::text, %(outcome)s::text, %(result)s::json, %(capability_id)s::text,
           %(capability_version)s::text, %(nondeterministic)s::json, %(duration_ms)s::bigint,
           ok.now, %(node_id)s::text
      FROM ok WHERE %(has_step)s
    RETURNING sequence
), moved AS (
    UPDATE flow_instance f
       SET next_sequence = f.next_sequence + CASE WHEN %(has_step)s THEN 1 ELSE 0 END,
           state_bag = coalesce(%(state_bag)s::json, f.state_bag),
           state_bag_sequence = CASE WHEN %(has_step)s AND %(state_bag)s::text IS NOT NULL
                                     THEN ok.seq ELSE f.state_bag_sequence END,
           state = coalesce(%(state)s::text, f.state),
           error = coalesce(%(error)s::json, f.error),
           resume_count = CASE WHEN %(has_step)s THEN 0 ELSE f.resume_count END,
           updated_at = ok.now,
           version = f.version + 1
      FROM ok
     WHERE f.instance_id = %(instance_id)s
    RETURNING 1
), staged AS (
    INSERT INTO outbox_event (event_id, instance_id, sequence, ordinal, type, schema_version,
                              partition_key, payload, staged_at, trace_context)
    SELECT e.event_id, %(instance_id)s, ok.seq, (e.ord - 1)::int, e.type, e.schema_version,
           e.partition_key, e.payload::json, ok.now, e.trace_context
      FROM ok, unnest(%(event_ids)b::uuid[], %(event_types)b::text[],
                      %(event_versions)b::text[], %(event_keys)b::text[],
                      %(event_payloads)b::text[], %(event_traces)b::text[])
           WITH ORDINALITY AS e(event_id, type, schema_version, partition_key, payload,
                                trace_context, ord)
    RETURNING 1
)
SELECT (SELECT fence FROM inst) AS fence,
       (SELECT seq FROM ok) AS seq,
       (SELECT count(*) FROM moved) AS moved,
       (SELECT count(*) FROM staged) AS staged
"""


def commit_params(commit: StepCommit) -> dict[str, Any]:
    step = commit.step
    events = commit.events
    return {
        "instance_id": commit.instance_id,
        "token": commit.token,
        "now": commit.now,
        "has_step": step is not None,
        "scope": step.scope if step else None,
        "step_id": step.step_id if step else None,
        "attempt": step.attempt if step else None,
        "step_name": step.step_name if step else None,
        "outcome": step.outcome.value if step else None,
        "result": step.result if step else None,
        "capability_id": step.capability_id if step else None,
        "capability_version": step.capability_version if step else None,
        "nondeterministic": step.nondeterministic if step else None,
        "duration_ms": step.duration_ms if step else None,
        "node_id": step.node_id if step else None,
        "state_bag": commit.state_bag,
        "state": commit.state.value if commit.state else None,
        "error": commit.error,
        "event_ids": [e.event_id for e in events],
        "event_types": [e.type for e in events],
        "event_versions": [e.schema_version for e in events],
        "event_keys": [e.partition_key for e in events],
        "event_payloads": [e.payload for e in events],
        "event_traces": [e.trace_context for e in events],
    }


async def commit_one(conn: psycopg.AsyncConnection[Any], commit: StepCommit) -> int | None:
    """The single-statement commit; translates refusals into store errors."""
    return outcome_of(commit, await send_one(conn, commit))


async def send_one(conn: psycopg.AsyncConnection[Any], commit: StepCommit) -> tuple[Any, ...]:
    """Send the single-statement commit; its result row (``outcome_of`` reads it)."""
    try:
        cur = await conn.execute(COMMIT, commit_params(commit), prepare=True)
    except psycopg.errors.UniqueViolation as exc:
        step = commit.step
        if step is not None and exc.diag.constraint_name == "flow_step_pkey":
            raise DuplicateStep(commit.instance_id, step.scope, step.step_id, step.attempt) from exc
        raise
    row = await cur.fetchone()
    assert row is not None  # nosec B101  # invariant: RETURNING answers one row
    return tuple(row)


def outcome_of(commit: StepCommit, row: tuple[Any, ...]) -> int | None:
    """The commit's sequence, or the store error its result row says."""
    fence, seq, moved = row[0], row[1], row[2]
    if fence is None:
        raise UnknownInstance(commit.instance_id)
    if not moved:
        raise FencedOut(commit.instance_id, commit.token, int(fence))
    return int(seq) if commit.step is not None else None


COMMIT_BATCH: Final[LiteralString] = """
WITH input AS (
    SELECT * FROM unnest(
        %(instance_ids)b::uuid[], %(tokens)b::bigint[], %(has_step)b::bool[],
        %(scopes)b::text[], %(step_ids)b::int[], %(attempts)b::int[], %(step_names)b::text[],
        %(outcomes)b::text[], %(results)b::text[], %(capability_ids)b::text[],
        %(capability_versions)b::text[], %(nondeterministic)b::text[],
        %(durations)b::bigint[], %(state_bags)b::text[], %(states)b::text[],
        %(errors)b::text[], %(nows)b::timestamptz[], %(node_ids)b::text[]
    ) WITH ORDINALITY AS i(instance_id, token, has_step, scope, step_id, attempt, step_name,
                           outcome, result, capability_id, capability_version,
                           nondeterministic, duration_ms, state_bag, state, error, now,
                           node_id, ord)
), locked AS (
    SELECT f.instance_id, f.fence, f.next_sequence
      FROM flow_instance f
     WHERE f.instance_id IN (SELECT instance_id FROM input)
     ORDER BY f.instance_id
       FOR UPDATE
), ok AS (
    SELECT i.instance_id, i.token, i.has_step, i.scope, i.step_id, i.attempt, i.step_name,
           i.outcome, i.result, i.capability_id, i.capability_version, i.nondeterministic,
           i.duration_ms, i.state_bag, i.state, i.error, coalesce(i.now, now()) AS now, i.ord,
           i.node_id, l.next_sequence AS seq
      FROM input i JOIN locked l ON l.instance_id = i.instance_id
     WHERE i.token >= l.fence
), step AS (
    INSERT INTO flow_step (instance_id, scope, step_id, attempt, sequence, step_name, outcome,
                           result, capability_id, capability_version, nondeterministic,
                           duration_ms, committed_at, node_id)
    SELECT instance_id, scope, step_id, attempt, seq, step_name, outcome, result::json,
           capability_id, capability_version, nondeterministic::json, duration_ms, now, node_id
      FROM ok WHERE has_step
    RETURNING 1
), moved AS (
    UPDATE flow_instance f
       SET next_sequence = f.next_sequence + CASE WHEN ok.has_step THEN 1 ELSE 0 END,
           state_bag = coalesce(ok.state_bag::json, f.state_bag),
           state_bag_sequence = CASE WHEN ok.has_step AND ok.state_bag IS NOT NULL
                                     THEN ok.seq ELSE f.state_bag_sequence END,
           state = coalesce(ok.state, f.state),
           error = coalesce(ok.error::json, f.error),
           resume_count = CASE WHEN ok.has_step THEN 0 ELSE f.resume_count END,
           updated_at = ok.now,
           version = f.version + 1
      FROM ok
     WHERE f.instance_id = ok.instance_id
    RETURNING ok.ord
), staged AS (
    INSERT INTO outbox_event (event_id, instance_id, sequence, ordinal, type, schema_version,
                              partition_key, payload, staged_at, trace_context)
    SELECT e.event_id, ok.instance_id, ok.seq, e.ordinal, e.type, e.schema_version,
           e.partition_key, e.payload::json, ok.now, e.trace_context
      FROM unnest(%(event_commit)b::bigint[], %(event_ordinals)b::int[], %(event_ids)b::uuid[],
                  %(event_types)b::text[], %(event_versions)b::text[], %(event_keys)b::text[],
                  %(event_payloads)b::text[], %(event_traces)b::text[])
           AS e(commit_ord, ordinal, event_id, type, schema_version, partition_key, payload,
                trace_context)
      JOIN ok ON ok.ord = e.commit_ord
     ORDER BY e.commit_ord, e.ordinal
    RETURNING 1
)
SELECT i.ord, l.fence, ok.seq
  FROM input i
  LEFT JOIN locked l ON l.instance_id = i.instance_id
  LEFT JOIN ok ON ok.ord = i.ord
 ORDER BY i.ord
"""


def batch_params(commits: list[StepCommit]) -> dict[str, Any]:
    """``COMMIT_BATCH``'s parameters, a column at a time (``arrays``: each says its type)."""
    steps = [c.step for c in commits]
    events = [(n, o, e) for n, c in enumerate(commits, start=1) for o, e in enumerate(c.events)]
    return {
        "instance_ids": Texts([c.instance_id for c in commits]),
        "tokens": BigInts([c.token for c in commits]),
        "has_step": Bools([s is not None for s in steps]),
        "scopes": Texts([s.scope if s else None for s in steps]),
        "step_ids": Ints([s.step_id if s else None for s in steps]),
        "attempts": Ints([s.attempt if s else None for s in steps]),
        "step_names": Texts([s.step_name if s else None for s in steps]),
        # A ``StrEnum`` member is a ``str`` of its value: sent as it is (``.value`` is a
        # property, costly on CPython 3.11, and this runs once a step).
        "outcomes": Texts([s.outcome if s else None for s in steps]),
        "results": Texts([s.result if s else None for s in steps]),
        "capability_ids": Texts([s.capability_id if s else None for s in steps]),
        "capability_versions": Texts([s.capability_version if s else None for s in steps]),
        "nondeterministic": Texts([s.nondeterministic if s else None for s in steps]),
        "durations": BigInts([s.duration_ms if s else None for s in steps]),
        "state_bags": Texts([c.state_bag for c in commits]),
        "states": Texts([c.state.value if c.state else None for c in commits]),
        "errors": Texts([c.error for c in commits]),
        "nows": Times([c.now for c in commits]),
        "node_ids": Texts([s.node_id if s else None for s in steps]),
        "event_commit": BigInts([n for n, _, _ in events]),
        "event_ordinals": Ints([o for _, o, _ in events]),
        "event_ids": Texts([e.event_id for _, _, e in events]),
        "event_types": Texts([e.type for _, _, e in events]),
        "event_versions": Texts([e.schema_version for _, _, e in events]),
        "event_keys": Texts([e.partition_key for _, _, e in events]),
        "event_payloads": Texts([e.payload for _, _, e in events]),
        "event_traces": Texts([e.trace_context for _, _, e in events]),
    }


class GroupCommitter:
    """Step commits batched (``batching.Batcher``), each instance once a batch, at most
    ``max_inflight`` batches at a time, each on a connection of its own."""

    def __init__(
        self, db: PostgresDatabase, *, max_batch: int = 256, max_inflight: int = 4
    ) -> None:
        self._db = db
        # One connection per batch in flight, held for good: no pool checkout per commit.
        # Probed after a second idle: an outage may have killed it meanwhile.
        self._slots = [
            DedicatedConnection(db, "step commits", check_after=1.0) for _ in range(max_inflight)
        ]
        self._batcher: Batcher[StepCommit, int | None] = Batcher(
            self._one,
            self._many,
            # ``attrgetter``: asked for every commit of a batch, and a lambda is a frame.
            key=attrgetter("instance_id"),
            max_batch=max_batch,
            max_inflight=max_inflight,
        )

    @property
    def batches(self) -> int:
        return self._batcher.batches

    @property
    def batched_commits(self) -> int:
        return self._batcher.batched

    @property
    def fallbacks(self) -> int:
        """Batches that failed on one commit's data and were retried commit by commit."""
        return self._batcher.fallbacks

    @property
    def _inflight(self) -> int:
        return self._batcher._inflight

    def commit(self, commit: StepCommit) -> asyncio.Future[int | None]:
        """The commit's outcome, once its batch is answered (the batcher's own future: no
        frame of this one around it on every step)."""
        return self._batcher.submit(commit)

    async def warm(self) -> None:
        """Open the committers' connections now, not on the first commits."""
        await asyncio.gather(*(slot.warm() for slot in self._slots))

    async def close(self) -> None:
        for slot in self._slots:
            await slot.close()

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        # At most max_inflight batches run, each one write at a time: one is always free.
        slot = self._slots.pop()
        try:
            async with slot.connection() as conn:
                yield conn
        finally:
            self._slots.append(slot)

    async def _one(self, commit: StepCommit) -> int | None:
        # Alone, or retried alone after its batch failed on one commit's data: a connection
        # block (and a deadline, R9.1) of its own, so one unanswered commit fails alone.
        async with self._slot() as conn:
            row = await send_one(conn, commit)
        return outcome_of(commit, row)

    async def _many(self, commits: list[StepCommit]) -> list[int | Exception | None]:
        async with self._slot() as conn:
            rows = await (await conn.execute(COMMIT_BATCH, batch_params(commits))).fetchall()
        outcomes: list[int | Exception | None] = []
        for commit, (_, fence, seq) in zip(commits, rows, strict=True):
            if fence is None:
                outcomes.append(UnknownInstance(commit.instance_id))
            elif seq is None:
                outcomes.append(FencedOut(commit.instance_id, commit.token, int(fence)))
            else:
                outcomes.append(int(seq) if commit.step is not None else None)
        return outcomes
