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

from flowx.stores.errors import FencedOut, InstanceFinished, UnknownInstance
from flowx.stores.postgres.database import PostgresDatabase
from flowx.stores.postgres.store import _INSTANCE_COLUMNS, _instance
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
# Statement 2 of a suspend, under the lock, fresh snapshot: is there a reason not to seal?
# An unconsumed signal of the awaited name (flow_signal_inbox_idx), or a child that has
# already ended (primary key). A null name or child matches nothing.
SUSPEND_BLOCKED: Final[LiteralString] = (
    "SELECT EXISTS (SELECT 1 FROM flow_signal WHERE instance_id = %(instance_id)s "
    "AND name = %(signal)s AND seq <> ALL (%(consumed)s::bigint[])) "
    "OR EXISTS (SELECT 1 FROM flow_instance WHERE instance_id = %(child)s::uuid "
    "AND state IN ('Completed', 'Failed', 'TimedOut', 'CompensationFailed'))"
)
# Statement 3: the seal. Parking and scheduling the wake are this one write (R2.11); no step
# row, no sequence. Primary key.
SUSPEND: Final[LiteralString] = (
    "UPDATE flow_instance SET state = 'Suspended', wake_at = %(wake_at)s, "
    "wake_step_id = %(step_id)s, wake_scope = %(scope)s, wake_signal = %(signal)s, "
    "state_bag = coalesce(%(state_bag)s::json, state_bag), updated_at = %(now)s, "
    "version = version + 1 WHERE instance_id = %(instance_id)s"
)

# A signal's statement 1: lock the instance first, so two deliveries of one key, or a
# delivery and a suspend, take turns. Primary key.
LOCK_FOR_SIGNAL: Final[LiteralString] = (
    "SELECT state, wake_signal FROM flow_instance WHERE instance_id = %s FOR UPDATE"
)
# flow_signal_key_idx.
SIGNAL_BY_KEY: Final[LiteralString] = (
    "SELECT seq FROM flow_signal WHERE instance_id = %s AND name = %s AND key = %s"
)
# The payload goes in as json: kept byte for byte (R2.1).
INSERT_SIGNAL: Final[LiteralString] = (
    "INSERT INTO flow_signal (instance_id, name, key, payload, received_at) "
    "VALUES (%s, %s, %s, %s::json, %s) RETURNING seq"
)
# Wake the instance if it waits for this name. Primary key.
WAKE_ON_SIGNAL: Final[LiteralString] = (
    "UPDATE flow_instance SET state = 'Pending', updated_at = %(now)s, version = version + 1 "
    "WHERE instance_id = %(instance_id)s AND state = 'Suspended' AND wake_signal = %(name)s "
    "RETURNING state"
)
# flow_signal_inbox_idx, in seq order.
SELECT_SIGNALS: Final[LiteralString] = (
    "SELECT instance_id, name, seq, key, payload, received_at FROM flow_signal "
    "WHERE instance_id = %s AND name = %s ORDER BY seq"
)

# flow_instance_wake_idx: a range scan of the partial index in wake_at order, no sort.
FIND_DUE: Final[LiteralString] = (
    "SELECT instance_id, flow_id, flow_version, state, updated_at FROM flow_instance "
    "WHERE state = 'Suspended' AND wake_at <= %s ORDER BY wake_at LIMIT %s"
)
# flow_instance_wake_idx: min() over an index is its first entry.
NEXT_WAKE: Final[LiteralString] = "SELECT min(wake_at) FROM flow_instance WHERE state = 'Suspended'"

# A replay re-opens the instance; history is untouched. Primary key.
REARM: Final[LiteralString] = (
    "UPDATE flow_instance SET state = 'Pending', replay_sequence = next_sequence, "
    "resume_from_step = %(from_step)s, updated_at = %(now)s, version = version + 1 "
    "WHERE instance_id = %(instance_id)s RETURNING " + _INSTANCE_COLUMNS
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

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    async def suspend(self, commit: SuspendCommit) -> bool:
        wake = commit.wake
        async with self._db.connection() as conn, conn.transaction():
            await _lock_fenced(conn, commit.instance_id, commit.token)
            blocked = await (
                await conn.execute(
                    SUSPEND_BLOCKED,
                    {
                        "instance_id": commit.instance_id,
                        "signal": wake.signal,
                        "consumed": list(commit.consumed),
                        "child": commit.child,
                    },
                )
            ).fetchone()
            if blocked is not None and blocked[0]:
                return False
            await conn.execute(
                SUSPEND,
                {
                    "instance_id": commit.instance_id,
                    "wake_at": wake.at,
                    "step_id": wake.step_id,
                    "scope": wake.scope,
                    "signal": wake.signal,
                    "state_bag": commit.state_bag,
                    "now": commit.now,
                },
            )
            return True

    async def signal(
        self, instance_id: str, name: str, payload: str, *, key: str | None, now: datetime
    ) -> SignalReceipt:
        async with self._db.connection() as conn, conn.transaction():
            row = await (await conn.execute(LOCK_FOR_SIGNAL, (instance_id,))).fetchone()
            if row is None:
                raise UnknownInstance(instance_id)
            state = InstanceState(row[0])
            if state.terminal:
                raise InstanceFinished(instance_id, state.value)
            if key is not None:
                found = await (
                    await conn.execute(SIGNAL_BY_KEY, (instance_id, name, key))
                ).fetchone()
                if found is not None:
                    return SignalReceipt(
                        instance_id=instance_id,
                        name=name,
                        seq=int(found[0]),
                        status="duplicate",
                        state=state,
                    )
            inserted = await (
                await conn.execute(INSERT_SIGNAL, (instance_id, name, key, payload, now))
            ).fetchone()
            assert inserted is not None
            woken = await (
                await conn.execute(
                    WAKE_ON_SIGNAL, {"instance_id": instance_id, "name": name, "now": now}
                )
            ).fetchone()
            return SignalReceipt(
                instance_id=instance_id,
                name=name,
                seq=int(inserted[0]),
                status="woken" if woken is not None else "kept",
                state=InstanceState.PENDING if woken is not None else state,
            )

    async def signals(self, instance_id: str, name: str) -> Sequence[SignalRecord]:
        async with self._db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            rows = await (await cur.execute(SELECT_SIGNALS, (instance_id, name))).fetchall()
        return tuple(SignalRecord(**r) for r in rows)

    async def find_due(self, *, now: datetime, limit: int) -> Sequence[RecoveryCandidate]:
        async with self._db.connection() as conn:
            rows = await (await conn.execute(FIND_DUE, (now, limit))).fetchall()
        return tuple(
            RecoveryCandidate(
                instance_id=r[0],
                flow_id=r[1],
                flow_version=r[2],
                state=InstanceState(r[3]),
                updated_at=r[4],
            )
            for r in rows
        )

    async def next_wake(self) -> datetime | None:
        async with self._db.connection() as conn:
            row = await (await conn.execute(NEXT_WAKE)).fetchone()
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
            return _instance(row)
