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
    TERMINAL_STATES_SQL,
    instance_of,
)
from flowx.stores.errors import FencedOut, UnknownInstance
from flowx.stores.postgres.batching import Batcher
from flowx.stores.postgres.database import PostgresDatabase
from flowx.stores.postgres.notify import Notifier
from flowx.stores.postgres.reads import BatchedReads
from flowx.stores.postgres.rows import candidates
from flowx.stores.postgres.signals import Delivery, deliver_many, deliver_one
from flowx.stores.postgres.suspends import suspend_many
from flowx.stores.records import (
    InstanceRecord,
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
    "UPDATE flow_instance SET "
    "state = CASE WHEN stop_request IS NULL THEN 'Suspended' ELSE 'Pending' END, "
    "wake_at = %(wake_at)s, "
    "wake_step_id = %(step_id)s, wake_scope = %(scope)s, wake_signal = %(signal)s, "
    "state_bag = coalesce(%(state_bag)s::json, state_bag), updated_at = %(now)s, "
    "version = version + 1 WHERE instance_id = %(instance_id)s AND fence <= %(token)s "
    "AND NOT EXISTS (SELECT 1 FROM flow_signal WHERE instance_id = %(instance_id)s "
    "AND name = %(signal)s AND seq <> ALL (%(consumed)b::bigint[])) "
    "AND NOT EXISTS (SELECT 1 FROM flow_instance c WHERE c.instance_id = %(child)s::uuid "
    "AND c.state IN " + TERMINAL_STATES_SQL + ") "
    "RETURNING 1"
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
    "AND (flow_id || '@' || flow_version) = ANY (%b::text[]) ORDER BY wake_at LIMIT %s"
)
# flow_instance_wake_idx: min() over an index is its first entry.
NEXT_WAKE: Final[LiteralString] = "SELECT min(wake_at) FROM flow_instance WHERE state = 'Suspended'"
# The same for the flows a node carries: the wake index walked in order to the first carried
# entry.
NEXT_WAKE_CARRIED: Final[LiteralString] = (
    "SELECT wake_at FROM flow_instance WHERE state = 'Suspended' AND wake_at IS NOT NULL "
    "AND (flow_id || '@' || flow_version) = ANY (%b::text[]) ORDER BY wake_at LIMIT 1"
)

# A replay re-opens the instance; history is untouched. Primary key.
REARM: Final[LiteralString] = (
    "UPDATE flow_instance SET state = 'Pending', "
    "replay_sequence = CASE WHEN %(resume)s THEN replay_sequence ELSE next_sequence END, "
    "resume_from_step = %(from_step)s, "
    "replay_from = CASE WHEN %(resume)s THEN replay_from ELSE %(rerun_from)s::integer END, "
    "stop_request = CASE WHEN %(rerun_from)s::integer IS NULL THEN stop_request END, "
    "wake_at = CASE WHEN %(rerun_from)s::integer IS NULL THEN wake_at END, "
    "wake_step_id = CASE WHEN %(rerun_from)s::integer IS NULL THEN wake_step_id END, "
    "wake_scope = CASE WHEN %(rerun_from)s::integer IS NULL THEN wake_scope END, "
    "wake_signal = CASE WHEN %(rerun_from)s::integer IS NULL THEN wake_signal END, "
    "deadline_at = COALESCE(%(deadline)s::timestamptz, deadline_at), resume_count = 0, "
    "updated_at = %(now)s, version = version + 1 "
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
        self._reads = BatchedReads(db)
        # Concurrent suspends share statements (suspends.py), as step commits do.
        self._suspends: Batcher[SuspendCommit, bool] = Batcher(
            self.suspend_one,
            lambda commits: suspend_many(db, commits),
            key=lambda c: c.instance_id,
        )
        # So do signal deliveries (signals.py); two to one instance take turns (R2.10).
        self._signals: Batcher[Delivery, SignalReceipt] = Batcher(
            lambda d: deliver_one(db, d),
            lambda batch: deliver_many(db, batch),
            key=lambda d: d.instance_id,
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
        delivered = await self._signals.submit(
            Delivery(instance_id, name, payload, key, now, limit)
        )
        if delivered.status == "woken" and self._work is not None:
            self._work.mark()  # Pending now: a worker elsewhere may take it at once
        return delivered

    async def signals(self, instance_id: str, name: str) -> Sequence[SignalRecord]:
        return await self._reads.signals(instance_id, name)

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
        self,
        instance_id: str,
        *,
        token: int,
        now: datetime,
        from_step: int,
        rerun_from: int | None = None,
        deadline: datetime | None = None,
        resume: bool = False,
    ) -> InstanceRecord:
        async with self._db.connection() as conn, conn.transaction():
            await _lock_fenced(conn, instance_id, token)
            cur = conn.cursor(row_factory=dict_row)
            params = {
                "instance_id": instance_id,
                "from_step": from_step,
                "rerun_from": rerun_from,
                "resume": resume,
                "deadline": deadline,
                "now": now,
            }
            row = await (await cur.execute(REARM, params)).fetchone()
            assert row is not None  # nosec B101  # invariant: locked above: it cannot have gone
        if self._work is not None:
            self._work.mark()
        return instance_of(row)
