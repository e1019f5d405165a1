"""Signal deliveries on PostgreSQL, alone or group-committed (R2.10, R6.2).

A delivery is two statements in one transaction, sent as one pipeline: the lock on the
instance row, then the keep-and-wake, whose snapshot is taken after the lock so that it sees
every delivery and every suspend that committed before it (a suspend locks the same row).
Deliveries that arrive while earlier ones are on the wire go out together (``Batcher``, as
step commits and suspends do): ``LOCK_MANY`` locks every row in id order (two batches cannot
deadlock), then ``DELIVER_BATCH`` does for each what ``DELIVER_SIGNAL`` does for one. A batch
never holds two deliveries to one instance: those take turns, as they must for R2.10's count.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, LiteralString

from flowx.stores.columns import TERMINAL_STATES_SQL
from flowx.stores.errors import InstanceFinished, UnknownInstance
from flowx.stores.postgres.arrays import Ints, Texts, Times
from flowx.stores.postgres.database import PostgresDatabase
from flowx.stores.records import InstanceState, SignalReceipt


@dataclass(frozen=True, slots=True)
class Delivery:
    """One ``WaitStore.signal`` call's arguments."""

    instance_id: str
    name: str
    payload: str
    key: str | None
    now: datetime
    limit: int | None


# A delivery's statement 1: lock the instance first, so two deliveries of one key, or a
# delivery and a suspend, take turns. Primary key.
LOCK_FOR_SIGNAL: Final[LiteralString] = (
    "SELECT state FROM flow_instance WHERE instance_id = %s FOR UPDATE"
)
# Statement 2, after the lock (so its snapshot sees every delivery and every suspend that
# committed before it): keep the signal unless the instance has ended, the key was seen
# (flow_signal_key_idx) or the inbox already holds as many of this name as the instance can
# ever take (flow_signal_inbox_idx; R2.10: counted under the lock, so racing signals to a wait
# that happens once keep exactly one), and wake the instance if it waits for this name — the
# keep and the wake are one write. The payload goes in as json: kept byte for byte (R2.1).
# The last two columns are the first copy's seq for a repeated key and the latest seq of the
# name (this statement's own insert is visible to neither).
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

# Primary key, in id order.
LOCK_MANY: Final[LiteralString] = (
    "SELECT instance_id::text, state FROM flow_instance "
    "WHERE instance_id = ANY (%(ids)b::uuid[]) ORDER BY instance_id FOR UPDATE"
)
# DELIVER_SIGNAL, one row per input (each input a different instance), in input order.
DELIVER_BATCH: Final[LiteralString] = (
    """
WITH input AS (
    SELECT * FROM unnest(
        %(ids)b::uuid[], %(names)b::text[], %(keys)b::text[], %(payloads)b::text[],
        %(limits)b::int[], %(nows)b::timestamptz[]
    ) WITH ORDINALITY AS i(instance_id, name, key, payload, lim, now, ord)
), live AS (
    SELECT i.* FROM input i JOIN flow_instance f ON f.instance_id = i.instance_id
     WHERE f.state NOT IN """
    + TERMINAL_STATES_SQL
    + """
       AND (i.lim IS NULL
            OR (SELECT count(*) FROM flow_signal s
                 WHERE s.instance_id = i.instance_id AND s.name = i.name) < i.lim)
), kept AS (
    INSERT INTO flow_signal (instance_id, name, key, payload, received_at)
    SELECT instance_id, name, key, payload::json, now FROM live ORDER BY ord
    ON CONFLICT (instance_id, name, key) WHERE key IS NOT NULL DO NOTHING
    RETURNING instance_id, seq
), woken AS (
    UPDATE flow_instance f SET state = 'Pending', updated_at = i.now, version = f.version + 1
      FROM input i JOIN kept k ON k.instance_id = i.instance_id
     WHERE f.instance_id = i.instance_id AND f.state = 'Suspended' AND f.wake_signal = i.name
    RETURNING f.instance_id
)
SELECT i.ord, k.seq, w.instance_id IS NOT NULL,
       (SELECT s.seq FROM flow_signal s WHERE s.instance_id = i.instance_id
           AND s.name = i.name AND s.key = i.key),
       (SELECT max(s.seq) FROM flow_signal s WHERE s.instance_id = i.instance_id
           AND s.name = i.name)
  FROM input i
  LEFT JOIN kept k ON k.instance_id = i.instance_id
  LEFT JOIN woken w ON w.instance_id = i.instance_id
 ORDER BY i.ord
"""
)


def receipt(
    d: Delivery, state: InstanceState, seq: Any, woken: bool, first: Any, last: Any
) -> SignalReceipt:
    """What the statement's row says, as ``WaitStore.signal`` answers it."""
    if seq is None and first is not None:  # a redelivery, even after the end (R2.10)
        return SignalReceipt(
            instance_id=d.instance_id,
            name=d.name,
            seq=int(first),
            status="duplicate",
            state=state,
        )
    if state.terminal:
        raise InstanceFinished(d.instance_id, state.value)
    if seq is None:  # every wait for it that happens once is spoken for (R2.10)
        return SignalReceipt(
            instance_id=d.instance_id,
            name=d.name,
            seq=int(last or 0),
            status="duplicate",
            state=state,
        )
    return SignalReceipt(
        instance_id=d.instance_id,
        name=d.name,
        seq=int(seq),
        status="woken" if woken else "kept",
        state=InstanceState.PENDING if woken else state,
    )


async def deliver_one(db: PostgresDatabase, d: Delivery) -> SignalReceipt:
    """One delivery in a transaction of its own: one round trip."""
    params = {
        "instance_id": d.instance_id,
        "name": d.name,
        "key": d.key,
        "payload": d.payload,
        "now": d.now,
        "limit": d.limit,
    }
    async with db.connection() as conn:
        async with conn.pipeline(), conn.transaction():
            locked = await conn.execute(LOCK_FOR_SIGNAL, (d.instance_id,), prepare=True)
            delivered = await conn.execute(DELIVER_SIGNAL, params, prepare=True)
        row = await locked.fetchone()
        outcome = await delivered.fetchone()
    if row is None:
        raise UnknownInstance(d.instance_id)
    assert outcome is not None  # nosec B101  # invariant: the insert answers one row
    seq, woken, first, last = outcome
    return receipt(d, InstanceState(row[0]), seq, bool(woken), first, last)


async def deliver_many(
    db: PostgresDatabase, batch: list[Delivery]
) -> list[SignalReceipt | Exception]:
    """Each delivery's receipt, or the error it alone failed with (``UnknownInstance``,
    ``InstanceFinished``): one round trip for the batch."""
    ids = Texts([d.instance_id for d in batch])
    params = {  # typed arrays (``arrays``), as the step commit's
        "ids": ids,
        "names": Texts([d.name for d in batch]),
        "keys": Texts([d.key for d in batch]),
        "payloads": Texts([d.payload for d in batch]),
        "limits": Ints([d.limit for d in batch]),
        "nows": Times([d.now for d in batch]),
    }
    async with db.connection() as conn:
        async with conn.pipeline(), conn.transaction():
            locked = await conn.execute(LOCK_MANY, {"ids": ids}, prepare=True)
            delivered = await conn.execute(DELIVER_BATCH, params, prepare=True)
        states = {str(r[0]): InstanceState(r[1]) for r in await locked.fetchall()}
        rows = await delivered.fetchall()
    outcomes: list[SignalReceipt | Exception] = []
    for d, (_, seq, woken, first, last) in zip(batch, rows, strict=True):
        state = states.get(d.instance_id)
        if state is None:
            outcomes.append(UnknownInstance(d.instance_id))
            continue
        try:
            outcomes.append(receipt(d, state, seq, bool(woken), first, last))
        except InstanceFinished as exc:
            outcomes.append(exc)
    return outcomes
