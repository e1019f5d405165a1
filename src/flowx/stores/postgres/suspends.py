"""Suspends group-committed, as step commits are (R6.2, issue 14 item 5).

A suspend is two statements in one transaction, sent as one pipeline (waits.py): the lock on
the instance row, then the seal, whose snapshot is taken after the lock so that it sees every
signal delivered, and every child ended, before it (a signal delivery locks the same row). A
batch keeps that order for all its instances at once: ``LOCK_MANY`` locks every row in id
order (so two batches cannot deadlock), then ``SUSPEND_BATCH`` seals each whose token passes
its fence and that has no reason not to wait.
"""

from __future__ import annotations

from typing import Any, Final, LiteralString

from flowx.stores.columns import TERMINAL_STATES_SQL
from flowx.stores.errors import FencedOut, UnknownInstance
from flowx.stores.postgres.arrays import BigInts, Ints, Texts, Times
from flowx.stores.postgres.database import PostgresDatabase
from flowx.stores.records import SuspendCommit

# Primary key, in id order.
LOCK_MANY: Final[LiteralString] = (
    "SELECT instance_id::text, fence FROM flow_instance "
    "WHERE instance_id = ANY (%(ids)b::uuid[]) ORDER BY instance_id FOR UPDATE"
)
# As SUSPEND (waits.py), one row per input; ``consumed`` is every input's consumed seqs,
# flattened with the input's ordinal.
SUSPEND_BATCH: Final[LiteralString] = (
    """
WITH input AS (
    SELECT * FROM unnest(
        %(ids)b::uuid[], %(tokens)b::bigint[], %(wake_ats)b::timestamptz[], %(step_ids)b::int[],
        %(scopes)b::text[], %(signals)b::text[], %(children)b::uuid[], %(state_bags)b::text[],
        %(nows)b::timestamptz[]
    ) WITH ORDINALITY AS i(instance_id, token, wake_at, step_id, scope, signal, child,
                           state_bag, now, ord)
), consumed AS (
    SELECT * FROM unnest(%(consumed_ords)b::bigint[], %(consumed_seqs)b::bigint[])
           AS c(ord, seq)
)
UPDATE flow_instance f
   SET state = CASE WHEN f.stop_request IS NULL THEN 'Suspended' ELSE 'Pending' END,
       wake_at = i.wake_at, wake_step_id = i.step_id,
       wake_scope = i.scope, wake_signal = i.signal,
       state_bag = coalesce(i.state_bag::json, f.state_bag), updated_at = i.now,
       version = f.version + 1
  FROM input i
 WHERE f.instance_id = i.instance_id AND f.fence <= i.token
   AND NOT EXISTS (SELECT 1 FROM flow_signal s
                    WHERE s.instance_id = i.instance_id AND s.name = i.signal
                      AND s.seq NOT IN (SELECT c.seq FROM consumed c WHERE c.ord = i.ord))
   AND NOT EXISTS (SELECT 1 FROM flow_instance c
                    WHERE c.instance_id = i.child AND c.state IN """
    + TERMINAL_STATES_SQL
    + """)
RETURNING i.ord
"""
)


def batch_params(commits: list[SuspendCommit]) -> dict[str, Any]:
    ords: list[int] = []
    seqs: list[int] = []
    for n, c in enumerate(commits, start=1):
        ords.extend([n] * len(c.consumed))
        seqs.extend(c.consumed)
    return {  # typed arrays (``arrays``), as the step commit's
        "ids": Texts([c.instance_id for c in commits]),
        "tokens": BigInts([c.token for c in commits]),
        "wake_ats": Times([c.wake.at for c in commits]),
        "step_ids": Ints([c.wake.step_id for c in commits]),
        "scopes": Texts([c.wake.scope for c in commits]),
        "signals": Texts([c.wake.signal for c in commits]),
        "children": Texts([c.child for c in commits]),
        "state_bags": Texts([c.state_bag for c in commits]),
        "nows": Times([c.now for c in commits]),
        "consumed_ords": BigInts(ords),
        "consumed_seqs": BigInts(seqs),
    }


async def suspend_many(
    db: PostgresDatabase, commits: list[SuspendCommit]
) -> list[bool | Exception]:
    """Each commit's outcome: sealed or not (``WaitStore.suspend``), or the error it alone
    failed with (``UnknownInstance``, ``FencedOut``)."""
    params = batch_params(commits)
    async with db.connection() as conn:
        async with conn.pipeline(), conn.transaction():
            locked = await conn.execute(LOCK_MANY, {"ids": params["ids"]}, prepare=True)
            sealed = await conn.execute(SUSPEND_BATCH, params, prepare=True)
        fences = {str(r[0]): int(r[1]) for r in await locked.fetchall()}
        done = {int(r[0]) for r in await sealed.fetchall()}
    outcomes: list[bool | Exception] = []
    for n, c in enumerate(commits, start=1):
        fence = fences.get(c.instance_id)
        if fence is None:
            outcomes.append(UnknownInstance(c.instance_id))
        elif c.token < fence:
            outcomes.append(FencedOut(c.instance_id, c.token, fence))
        else:
            outcomes.append(n in done)
    return outcomes
