"""Leases on the SQLite file, and what takes an instance under one: open and claim.

Each function runs inside the caller's write transaction (``SqliteDatabase.write``), whose
``BEGIN IMMEDIATE`` holds the file's write lock: the fence is read and raised under it, as
PostgreSQL does under the instance's row lock.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Final

from flowx.clock import or_process_now
from flowx.stores.columns import STEP_COLUMNS
from flowx.stores.errors import FencedOut, UnknownInstance
from flowx.stores.records import History, Lease
from flowx.stores.sqlite.database import to_text
from flowx.stores.sqlite.rows import read_instance, step_row

# Served by the primary key; rows come back in commit order (R2.8).
SELECT_STEPS: Final = (
    f"SELECT {STEP_COLUMNS} FROM flow_step WHERE instance_id = ? ORDER BY sequence"
)
# Primary key, both.
FENCE_OF: Final = "SELECT fence FROM flow_instance WHERE instance_id = ?"
RAISE_FENCE: Final = "UPDATE flow_instance SET fence = ? WHERE instance_id = ? AND fence < ?"
# The fence rises before anything is read (R2.4); a queued (Pending) or woken (Suspended)
# instance is Running from here on.
_OPEN: Final = (
    "UPDATE flow_instance SET fence = ?, resume_count = resume_count + 1, "
    "state = CASE WHEN state IN ('Pending', 'Suspended') THEN 'Running' ELSE state END, "
    "updated_at = ?, version = version + 1 WHERE instance_id = ?"
)
# flow_instance_queued_idx, in the order the recovery scan reads it; ``?2`` a JSON array of
# the carried ``flow@version`` refs, or NULL for all.
_QUEUED: Final = (
    "SELECT instance_id, fence FROM flow_instance INDEXED BY flow_instance_queued_idx "
    "WHERE state = 'Pending' AND (?2 IS NULL OR flow_id || '@' || flow_version IN "
    "(SELECT value FROM json_each(?2))) AND NOT EXISTS (SELECT 1 FROM flow_lease l "
    "WHERE l.instance_id = flow_instance.instance_id AND l.expires_at > ?3) "
    "ORDER BY updated_at, instance_id LIMIT ?1"
)


def acquire_in(
    conn: sqlite3.Connection,
    instance_id: str,
    owner: str,
    ttl: timedelta,
    now: datetime | None,
    floor: int,
) -> Lease | None:
    """Grant the lease inside the caller's write transaction."""
    now = or_process_now(now)  # read under the write lock
    row = conn.execute(
        "SELECT fencing_token, expires_at FROM flow_lease WHERE instance_id = ?",
        (instance_id,),
    ).fetchone()
    stamp, expires = to_text(now), now + ttl
    if row is not None and row[1] > stamp:
        return None
    token = max(row[0] if row else 0, floor) + 1
    conn.execute(
        "INSERT INTO flow_lease (instance_id, owner_node, fencing_token, expires_at, "
        "acquired_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (instance_id) DO UPDATE SET "
        "owner_node = excluded.owner_node, fencing_token = excluded.fencing_token, "
        "expires_at = excluded.expires_at, acquired_at = excluded.acquired_at",
        (instance_id, owner, token, to_text(expires), stamp),
    )
    return Lease(instance_id=instance_id, owner=owner, token=token, expires_at=expires)


def release_in(conn: sqlite3.Connection, instance_id: str, token: int, now: datetime) -> None:
    """End the lease ``token`` names, if it is still the live one."""
    stamp = to_text(now)
    conn.execute(
        "UPDATE flow_lease SET expires_at = ? "
        "WHERE instance_id = ? AND fencing_token = ? AND expires_at > ?",
        (stamp, instance_id, token, stamp),
    )


def open_in(
    conn: sqlite3.Connection, instance_id: str, token: int, now: datetime | None
) -> History:
    """``FlowJournal.open``: raise the fence to ``token``, then read the history."""
    stamp = to_text(or_process_now(now))  # read under the write lock
    row = conn.execute(FENCE_OF, (instance_id,)).fetchone()
    if row is None:
        raise UnknownInstance(instance_id)
    if token < row[0]:
        raise FencedOut(instance_id, token, row[0])
    conn.execute(_OPEN, (token, stamp, instance_id))
    instance = read_instance(conn, instance_id)
    assert instance is not None  # nosec B101  # invariant: its fence was read above, under lock
    steps = tuple(step_row(r) for r in conn.execute(SELECT_STEPS, (instance_id,)))
    return History(instance=instance, steps=steps)


def claim_queued_in(
    conn: sqlite3.Connection,
    *,
    owner: str,
    ttl: timedelta,
    limit: int,
    flows: Sequence[str] | None,
    now: datetime | None,
) -> list[tuple[Lease, History]]:
    """``QueueClaims``: up to ``limit`` Pending instances of ``flows``, each leased, opened
    and read, in one write. One whose lease is live elsewhere (a start that has not yet
    released it) is passed over and stays Pending."""
    moment = or_process_now(now)
    carried = None if flows is None else json.dumps(list(flows))
    claimed: list[tuple[Lease, History]] = []
    # Read in full before writing: the writes below change the index the read walks.
    page = conn.execute(_QUEUED, (limit, carried, to_text(moment))).fetchall()
    for instance_id, fence in page:
        lease = acquire_in(conn, instance_id, owner, ttl, moment, fence)
        if lease is not None:
            claimed.append((lease, open_in(conn, instance_id, lease.token, moment)))
    return claimed
