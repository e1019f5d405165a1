"""``WaitStore`` on the SQLite file: suspend, signal, the timer's due list, and replay
(R2.10, R2.11).

Every write runs inside ``SqliteDatabase.write`` (``BEGIN IMMEDIATE``): the file's write lock
is held from the first statement, so a suspend's check and its seal, or a signal's insert and
its wake, cannot interleave with another process's. Timestamps are written with ``to_text``
(fixed-width UTC), so the textual comparisons on ``wake_at`` are time comparisons.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Final

from flowx.stores.columns import CANDIDATE_COLUMNS, SIGNAL_COLUMNS, TERMINAL_STATES_SQL
from flowx.stores.errors import FencedOut, InstanceFinished, UnknownInstance
from flowx.stores.records import (
    InstanceRecord,
    InstanceState,
    RecoveryCandidate,
    SignalReceipt,
    SignalRecord,
    SuspendCommit,
)
from flowx.stores.sqlite.database import SqliteDatabase, from_text, to_text
from flowx.stores.sqlite.rows import candidates, read_instance, signal_row

# Primary key.
FENCE_OF: Final = "SELECT fence FROM flow_instance WHERE instance_id = ?"
# Is there a reason not to seal? An unconsumed signal of the awaited name
# (flow_signal_inbox_idx; ``consumed`` is a JSON array of seqs), or a child that has already
# ended (primary key). A null name or child matches nothing.
SUSPEND_BLOCKED: Final = (
    "SELECT EXISTS (SELECT 1 FROM flow_signal WHERE instance_id = :instance_id "
    "AND name = :signal AND seq NOT IN (SELECT value FROM json_each(:consumed))) "
    "OR EXISTS (SELECT 1 FROM flow_instance WHERE instance_id = :child "
    f"AND state IN {TERMINAL_STATES_SQL})"
)
# The seal: parking and scheduling the wake are this one write (R2.11). Primary key.
SUSPEND: Final = (
    "UPDATE flow_instance SET "
    "state = CASE WHEN stop_request IS NULL THEN 'Suspended' ELSE 'Pending' END, "
    "wake_at = :wake_at, "
    "wake_step_id = :step_id, wake_scope = :scope, wake_signal = :signal, "
    "state_bag = coalesce(:state_bag, state_bag), updated_at = :now, "
    "version = version + 1 WHERE instance_id = :instance_id"
)

# Primary key.
STATE_OF: Final = "SELECT state FROM flow_instance WHERE instance_id = ?"
# flow_signal_key_idx.
SIGNAL_BY_KEY: Final = "SELECT seq FROM flow_signal WHERE instance_id = ? AND name = ? AND key = ?"
# How many of this name the inbox holds, and the latest (flow_signal_inbox_idx).
INBOX_OF: Final = "SELECT count(*), max(seq) FROM flow_signal WHERE instance_id = ? AND name = ?"
# The payload text is kept exactly as sent (R2.1).
INSERT_SIGNAL: Final = (
    "INSERT INTO flow_signal (instance_id, name, key, payload, received_at) "
    "VALUES (?, ?, ?, ?, ?) RETURNING seq"
)
# Wake the instance if it waits for this name. Primary key.
WAKE_ON_SIGNAL: Final = (
    "UPDATE flow_instance SET state = 'Pending', updated_at = ?, version = version + 1 "
    "WHERE instance_id = ? AND state = 'Suspended' AND wake_signal = ?"
)
# flow_signal_inbox_idx, in seq order.
SELECT_SIGNALS: Final = (
    f"SELECT {SIGNAL_COLUMNS} FROM flow_signal WHERE instance_id = ? AND name = ? ORDER BY seq"
)

# flow_instance_wake_idx, read in wake_at order: no sort.
FIND_DUE: Final = (
    f"SELECT {CANDIDATE_COLUMNS} "
    "FROM flow_instance INDEXED BY flow_instance_wake_idx "
    "WHERE state = 'Suspended' AND wake_at <= ? ORDER BY wake_at LIMIT ?"
)
# The same, only for the flows a node carries (a JSON list of "flow_id@version" refs).
FIND_DUE_CARRIED: Final = (
    f"SELECT {CANDIDATE_COLUMNS} "
    "FROM flow_instance INDEXED BY flow_instance_wake_idx "
    "WHERE state = 'Suspended' AND wake_at <= ? "
    "AND (flow_id || '@' || flow_version) IN (SELECT value FROM json_each(?)) "
    "ORDER BY wake_at LIMIT ?"
)
# flow_instance_wake_idx: min() over an index is its first entry.
NEXT_WAKE: Final = "SELECT min(wake_at) FROM flow_instance WHERE state = 'Suspended'"
# The same for the flows a node carries: the first carried entry of the wake index.
NEXT_WAKE_CARRIED: Final = (
    "SELECT wake_at FROM flow_instance INDEXED BY flow_instance_wake_idx "
    "WHERE state = 'Suspended' AND wake_at IS NOT NULL "
    "AND (flow_id || '@' || flow_version) IN (SELECT value FROM json_each(?)) "
    "ORDER BY wake_at LIMIT 1"
)

# A replay re-opens the instance; history is untouched. Primary key.
REARM: Final = (
    "UPDATE flow_instance SET state = 'Pending', "
    "replay_sequence = CASE WHEN :resume THEN replay_sequence ELSE next_sequence END, "
    "resume_from_step = :from_step, "
    "replay_from = CASE WHEN :resume THEN replay_from ELSE :rerun_from END, "
    "stop_request = CASE WHEN :rerun_from IS NULL THEN stop_request END, "
    "wake_at = CASE WHEN :rerun_from IS NULL THEN wake_at END, "
    "wake_step_id = CASE WHEN :rerun_from IS NULL THEN wake_step_id END, "
    "wake_scope = CASE WHEN :rerun_from IS NULL THEN wake_scope END, "
    "wake_signal = CASE WHEN :rerun_from IS NULL THEN wake_signal END, "
    "deadline_at = COALESCE(:deadline, deadline_at), resume_count = 0, updated_at = :now, "
    "version = version + 1 WHERE instance_id = :instance_id"
)


def _check_fence(conn: sqlite3.Connection, instance_id: str, token: int) -> None:
    row = conn.execute(FENCE_OF, (instance_id,)).fetchone()
    if row is None:
        raise UnknownInstance(instance_id)
    if token < row[0]:
        raise FencedOut(instance_id, token, row[0])


class SqliteWaits:
    """``WaitStore``: each write one ``BEGIN IMMEDIATE`` transaction."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def suspend(self, commit: SuspendCommit) -> bool:
        wake = commit.wake

        def tx(conn: sqlite3.Connection) -> bool:
            _check_fence(conn, commit.instance_id, commit.token)
            blocked = conn.execute(
                SUSPEND_BLOCKED,
                {
                    "instance_id": commit.instance_id,
                    "signal": wake.signal,
                    "consumed": json.dumps(list(commit.consumed)),
                    "child": commit.child,
                },
            ).fetchone()[0]
            if blocked:
                return False
            conn.execute(
                SUSPEND,
                {
                    "instance_id": commit.instance_id,
                    "wake_at": to_text(wake.at) if wake.at is not None else None,
                    "step_id": wake.step_id,
                    "scope": wake.scope,
                    "signal": wake.signal,
                    "state_bag": commit.state_bag,
                    "now": to_text(commit.now),
                },
            )
            return True

        return await self._db.write(tx)

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
        def duplicate(seq: int, state: InstanceState) -> SignalReceipt:
            return SignalReceipt(
                instance_id=instance_id, name=name, seq=seq, status="duplicate", state=state
            )

        def tx(conn: sqlite3.Connection) -> SignalReceipt:
            row = conn.execute(STATE_OF, (instance_id,)).fetchone()
            if row is None:
                raise UnknownInstance(instance_id)
            state = InstanceState(row[0])
            if key is not None:  # a redelivery, even after the end (R2.10)
                found = conn.execute(SIGNAL_BY_KEY, (instance_id, name, key)).fetchone()
                if found is not None:
                    return duplicate(found[0], state)
            if state.terminal:
                raise InstanceFinished(instance_id, state.value)
            if limit is not None:
                # R2.10: counted in the same write transaction as the insert below, so racing
                # signals to a wait that happens once keep exactly one.
                held, last = conn.execute(INBOX_OF, (instance_id, name)).fetchone()
                if held >= limit:
                    return duplicate(last or 0, state)
            seq = conn.execute(
                INSERT_SIGNAL, (instance_id, name, key, payload, to_text(now))
            ).fetchone()[0]
            woken = conn.execute(WAKE_ON_SIGNAL, (to_text(now), instance_id, name)).rowcount == 1
            return SignalReceipt(
                instance_id=instance_id,
                name=name,
                seq=seq,
                status="woken" if woken else "kept",
                state=InstanceState.PENDING if woken else state,
            )

        return await self._db.write(tx)

    async def signals(self, instance_id: str, name: str) -> Sequence[SignalRecord]:
        def q(conn: sqlite3.Connection) -> Sequence[SignalRecord]:
            return tuple(signal_row(r) for r in conn.execute(SELECT_SIGNALS, (instance_id, name)))

        return await self._db.run(q)

    async def find_due(
        self, *, now: datetime, limit: int, flows: Sequence[str] | None = None
    ) -> Sequence[RecoveryCandidate]:
        def q(conn: sqlite3.Connection) -> Sequence[RecoveryCandidate]:
            if flows is None:
                return candidates(conn, FIND_DUE, (to_text(now), limit))
            refs = json.dumps(list(flows))
            return candidates(conn, FIND_DUE_CARRIED, (to_text(now), refs, limit))

        return await self._db.run(q)

    async def next_wake(self, *, flows: Sequence[str] | None = None) -> datetime | None:
        def q(conn: sqlite3.Connection) -> datetime | None:
            if flows is None:
                row = conn.execute(NEXT_WAKE).fetchone()
            else:
                row = conn.execute(NEXT_WAKE_CARRIED, (json.dumps(list(flows)),)).fetchone()
            return from_text(row[0]) if row is not None and row[0] is not None else None

        return await self._db.run(q)

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
        def tx(conn: sqlite3.Connection) -> InstanceRecord:
            _check_fence(conn, instance_id, token)
            conn.execute(
                REARM,
                {
                    "from_step": from_step,
                    "rerun_from": rerun_from,
                    "resume": resume,
                    "deadline": to_text(deadline) if deadline is not None else None,
                    "now": to_text(now),
                    "instance_id": instance_id,
                },
            )
            record = read_instance(conn, instance_id)
            assert record is not None  # nosec B101  # invariant: fence read above, under lock
            return record

        return await self._db.write(tx)
