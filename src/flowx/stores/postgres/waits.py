"""``WaitStore`` on PostgreSQL: suspend, signal, the timer's due list, and replay (R2.10, R2.11).

Every query is a constant below, with the index that serves it named beside it. Each write
locks the instance row first (``FOR UPDATE``) and does its checks in later statements: under
READ COMMITTED each statement takes a fresh snapshot, so a check made after the lock sees
every write that committed before the lock was granted. That is what keeps a wake-up from
being lost between a suspend's check and its seal, whichever of the two comes first.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final, LiteralString

import psycopg
from psycopg.rows import dict_row

from flowx.stores.columns import (
    CANDIDATE_COLUMNS,
    INSTANCE_COLUMNS,
    SIGNAL_COLUMNS,
    TERMINAL_STATES_SQL,
    instance_of,
    signal_of,
)
from flowx.stores.errors import FencedOut, InstanceFinished, UnknownInstance
from flowx.stores.postgres.batching import Batcher
from flowx.stores.postgres.database import PostgresDatabase
from flowx.stores.postgres.notify import Notifier
from flowx.stores.postgres.rows import candidates
from flowx.stores.postgres.suspends import suspend_many
from flowx.stores.records import (
    InstanceRecord,
    InstanceState,
    RecoveryCandidate,
    SignalReceipt,
    SignalRecord,
    SuspendCommit,
)

# Statement 1 of a fenced write: lock the row, read the fence. Primary key.
LOCK_FENCE: Final[LiteralString] = (
    "SELECT fence FROM flow_instance WHERE instance_id = %s FOR UPDATE"
)
# Statement 2 of a suspend, after the lock, so with a snapshot taken after it: the seal,
# unless the instance may no longer write (fence) or there is a reason not to wait — an
# unconsumed signal of the awaited name (flow_signal_inbox_idx) or a child that has already
# ended (primary key); a null name or child matches nothing. Parking and scheduling the wake
# are this one write (R2.11): no step row, no sequence. Sent with the lock and the COMMIT in
# one pipeline: one round trip.
SUSPEND: Final[LiteralString] = (
    "UPDATE flow_instance SET state = 'Suspended', wake_at = %(wake_at)s, "
    "wake_step_id = %(step_id)s, wake_scope = %(scope)s, wake_signal = %(signal)s, "
    "state_bag = coalesce(%(state_bag)s::json, state_bag), updated_at = %(now)s, "
    "version = version + 1 WHERE instance_id = %(instance_id)s AND fence <= %(token)s "
    "AND NOT EXISTS (SELECT 1 FROM flow_signal WHERE instance_id = %(instance_id)s "
    "AND name = %(signal)s AND seq <> ALL (%(consumed)s::bigint[])) "
    "AND NOT EXISTS (SELECT 1 FROM flow_instance c WHERE c.instance_id = %(child)s::uuid "
    "AND c.state IN " + TERMINAL_STATES_SQL + ") "
    "RETURNING 1"
)

# A signal's statement 1: lock the instance first, so two deliveries of one key, or a
# delivery and a suspend, take turns. Primary key.
LOCK_FOR_SIGNAL: Final[LiteralString] = (
    "SELECT state, wake_signal FROM flow_instance WHERE instance_id = %s FOR UPDATE"
)
# A signal's statement 2, after the lock (so its snapshot sees every delivery and every
# suspend that committed before it): keep the signal unless the instance has ended, the key
# was seen (flow_signal_key_idx) or the inbox already holds as many of this name as the
# instance can ever take (flow_signal_inbox_idx; R2.10: counted under the lock, so racing
# signals to a wait that happens once keep exactly one), and wake the instance if it waits
# for this name — the keep and the wake are one write. The payload goes in as json: kept
# byte for byte (R2.1). The last two columns are the first copy's seq for a repeated key and
# the latest seq of the name (this statement's own insert is visible to neither). Sent with
# the lock and the COMMIT in one pipeline: one round trip.
DELIVER_SIGNAL: Final[LiteralString] = (
    """
WITH live AS (
    SELECT 1 FROM flow_instance WHERE instance_id = %(instance_id)s
       AND state NOT IN """
    + TERMINAL_STATES_SQL
    + """
       AND (%(limit)s::int IS NULL
            OR (SELECT count(*) FROM flow_signal
                 WHERE instance_id = %(instance_id)s AND name = %(name)s) < %(limit)s::int)
), kept AS (
    INSERT INTO flow_signal (instance_id, name, key, payload, received_at)
    SELECT %(instance_id)s, %(name)s, %(key)s, %(payload)s::json, %(now)s FROM live
    ON CONFLICT (instance_id, name, key) WHERE key IS NOT NULL DO NOTHING
    RETURNING seq
), woken AS (
    UPDATE flow_instance SET state = 'Pending', updated_at = %(now)s, version = version + 1
     WHERE instance_id = %(instance_id)s AND state = 'Suspended' AND wake_signal = %(name)s
       AND EXISTS (SELECT 1 FROM kept)
    RETURNING 1
)
SELECT (SELECT seq FROM kept), (SELECT count(*) FROM woken),
       (SELECT seq FROM flow_signal WHERE instance_id = %(instance_id)s AND name = %(name)s
         AND key = %(key)s),
       (SELECT max(seq) FROM flow_signal WHERE instance_id = %(instance_id)s AND name = %(name)s)
"""
)
# flow_signal_inbox_idx, in seq order.
SELECT_SIGNALS: Final[LiteralString] = (
    "SELECT " + SIGNAL_COLUMNS + " FROM flow_signal "
    "WHERE instance_id = %s AND name = %s ORDER BY seq"
)

# flow_instance_wake_idx: a range scan of the partial index in wake_at order, no sort.
FIND_DUE: Final[LiteralString] = (
    "SELECT " + CANDIDATE_COLUMNS + " FROM flow_instance "
    "WHERE state = 'Suspended' AND wake_at <= %s ORDER BY wake_at LIMIT %s"
)
# The same, only for the flows a node carries: still the wake_at range scan, the refs a filter.
FIND_DUE_CARRIED: Final[LiteralString] = (
    "SELECT " + CANDIDATE_COLUMNS + " FROM flow_instance "
    "WHERE state = 'Suspended' AND wake_at <= %s "
    "AND (flow_id || '@' || flow_version) = ANY (%s::text[]) ORDER BY wake_at LIMIT %s"
)
# flow_instance_wake_idx: min() over an index is its first entry.
NEXT_WAKE: Final[LiteralString] = "SELECT min(wake_at) FROM flow_instance WHERE state = 'Suspended'"
# The same for the flows a node carries: the wake index walked in order to the first carried
# entry.
NEXT_WAKE_CARRIED: Final[LiteralString] = (
    "SELECT wake_at FROM flow_instance WHERE state = 'Suspended' AND wake_at IS NOT NULL "
    "AND (flow_id || '@' || flow_version) = ANY (%s::text[]) ORDER BY wake_at LIMIT 1"
)

# A replay re-opens the instance; history is untouched. Primary key.
REARM: Final[LiteralString] = (
    "UPDATE flow_instance SET state = 'Pending', replay_sequence = next_sequence, "
    "resume_from_step = %(from_step)s, updated_at = %(now)s, version = version + 1 "
    "WHERE instance_id = %(instance_id)s RETURNING " + INSTANCE_COLUMNS
)


async def _lock_fenced(conn: psycopg.AsyncConnection[Any], instance_id: str, token: int) -> None:
    """Statement 1: lock the row; refuse an unknown instance or a stale token (R2.4)."""
    row = await (await conn.execute(LOCK_FENCE, (instance_id,))).fetchone()
    if row is None:
        raise UnknownInstance(instance_id)
    fence = int(row[0])
    if token < fence:
        raise FencedOut(instance_id, token, fence)


class PostgresWaits:
    """``WaitStore``: each write one transaction that locks the instance row first."""

    def __init__(self, db: PostgresDatabase, work: Notifier | None = None) -> None:
        self._db = db
        self._work = work
        # Concurrent suspends share statements (suspends.py), as step commits do.
        self._suspends: Batcher[SuspendCommit, bool] = Batcher(
            self.suspend_one,
            lambda commits: suspend_many(db, commits),
            key=lambda c: c.instance_id,
        )

    async def suspend(self, commit: SuspendCommit) -> bool:
        return await self._suspends.submit(commit)

    async def suspend_one(self, commit: SuspendCommit) -> bool:
        """One suspend in a transaction of its own: the lock, then the seal."""
        wake = commit.wake
        params = {
            "instance_id": commit.instance_id,
            "token": commit.token,
            "wake_at": wake.at,
            "step_id": wake.step_id,
            "scope": wake.scope,
            "signal": wake.signal,
            "consumed": list(commit.consumed),
            "child": commit.child,
            "state_bag": commit.state_bag,
            "now": commit.now,
        }
        async with self._db.connection() as conn:
            async with conn.pipeline(), conn.transaction():
                locked = await conn.execute(LOCK_FENCE, (commit.instance_id,), prepare=True)
                sealed = await conn.execute(SUSPEND, params, prepare=True)
            fence = await locked.fetchone()
            if fence is None:
                raise UnknownInstance(commit.instance_id)
            if commit.token < int(fence[0]):
                raise FencedOut(commit.instance_id, commit.token, int(fence[0]))
            return await sealed.fetchone() is not None

    async def signal(
        self,
        instance_id: str,
        name: str,
        payload: str,
        *,
        key: str | None,
        now: datetime,
        limit: int | None = None,
    ) -> SignalReceipt:
        params = {
            "instance_id": instance_id,
            "name": name,
            "key": key,
            "payload": payload,
            "now": now,
            "limit": limit,
        }
        async with self._db.connection() as conn:
            async with conn.pipeline(), conn.transaction():
                locked = await conn.execute(LOCK_FOR_SIGNAL, (instance_id,), prepare=True)
                delivered = await conn.execute(DELIVER_SIGNAL, params, prepare=True)
            row = await locked.fetchone()
            outcome = await delivered.fetchone()
        if row is None:
            raise UnknownInstance(instance_id)
        state = InstanceState(row[0])
        assert outcome is not None
        seq, woken, first, last = outcome
        if seq is None and first is not None:  # a redelivery, even after the end (R2.10)
            return SignalReceipt(
                instance_id=instance_id, name=name, seq=int(first), status="duplicate", state=state
            )
        if state.terminal:
            raise InstanceFinished(instance_id, state.value)
        if seq is None:  # every wait for it that happens once is spoken for (R2.10)
            return SignalReceipt(
                instance_id=instance_id,
                name=name,
                seq=int(last or 0),
                status="duplicate",
                state=state,
            )
        if woken and self._work is not None:
            self._work.mark()  # Pending now: a worker elsewhere may take it at once
        return SignalReceipt(
            instance_id=instance_id,
            name=name,
            seq=int(seq),
            status="woken" if woken else "kept",
            state=InstanceState.PENDING if woken else state,
        )

    async def signals(self, instance_id: str, name: str) -> Sequence[SignalRecord]:
        async with self._db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            rows = await (await cur.execute(SELECT_SIGNALS, (instance_id, name))).fetchall()
        return tuple(signal_of(r) for r in rows)

    async def find_due(
        self, *, now: datetime, limit: int, flows: Sequence[str] | None = None
    ) -> Sequence[RecoveryCandidate]:
        if flows is None:
            return await candidates(self._db, FIND_DUE, (now, limit))
        return await candidates(self._db, FIND_DUE_CARRIED, (now, list(flows), limit))

    async def next_wake(self, *, flows: Sequence[str] | None = None) -> datetime | None:
        async with self._db.connection() as conn:
            if flows is None:
                row = await (await conn.execute(NEXT_WAKE)).fetchone()
            else:
                row = await (await conn.execute(NEXT_WAKE_CARRIED, (list(flows),))).fetchone()
        return row[0] if row is not None else None

    async def rearm(
        self, instance_id: str, *, token: int, now: datetime, from_step: int
    ) -> InstanceRecord:
        async with self._db.connection() as conn, conn.transaction():
            await _lock_fenced(conn, instance_id, token)
            cur = conn.cursor(row_factory=dict_row)
            params = {"instance_id": instance_id, "from_step": from_step, "now": now}
            row = await (await cur.execute(REARM, params)).fetchone()
            assert row is not None  # locked above: it cannot have gone
        if self._work is not None:
            self._work.mark()
        return instance_of(row)
