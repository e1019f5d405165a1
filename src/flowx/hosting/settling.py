"""What a node does after a journal round trip got no answer within its deadline (R9.1).

A slow disk or a lost reply leaves a write's outcome unknown while the journal is still
there. Leaving the instance for recovery would cost a TTL and a new token for nothing: the
node still holds the lease, so it settles the outcome itself — it re-reads under that lease
and runs on (``reopen``), and it renews what a slow claim took before running it
(``renew_late``). Where it cannot — the journal refuses connections, the lease is gone, a
call the run gave up on still runs — the instance is left for recovery, as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from flowx.errors import FlowXError
from flowx.hosting.context import NodeContext
from flowx.hosting.lease import DurableLease
from flowx.hosting.threads import RunThreads
from flowx.stores.errors import (
    FencedOut,
    JournalNoAnswer,
    JournalUnavailable,
    LeaseLost,
    UnknownInstance,
)
from flowx.stores.protocols import Stores
from flowx.stores.records import History, Lease

log = logging.getLogger("flowx.host")


async def renew_late(
    ctx: NodeContext, stores: Stores, claimed: Sequence[tuple[Lease, History]]
) -> tuple[list[tuple[Lease, History]], float]:
    """Renew what a slow claim took (a slow disk, a commit settled by re-reading) before
    running it: a lease's liveness here counts from when its grant was sent, and that
    may be most of the way to its local limit already. One not renewed is left to run
    out and be recovered; an error leaves them all so."""
    sent = time.monotonic()
    try:
        renewed = await stores.leases.renew_many(
            [lease for lease, _ in claimed],
            ttl=ctx.settings.lease_ttl,
            now=ctx.clock.store_time(),
        )
    except FlowXError as exc:
        log.warning(
            "renewing %d instance(s) a slow claim took failed (%s); recovery takes them "
            "once their leases run out",
            len(claimed),
            exc,
        )
        return [], sent
    kept = [(lease, h) for lease, (_, h) in zip(renewed, claimed, strict=True) if lease]
    if len(kept) < len(claimed):
        log.warning(
            "%d of %d instance(s) a slow claim took had their leases run out before "
            "they could be renewed; recovery takes them",
            len(claimed) - len(kept),
            len(claimed),
        )
    return kept, sent


async def reopen(
    ctx: NodeContext, lease: DurableLease, threads: RunThreads | None, exc: JournalNoAnswer
) -> History | None:
    """Re-open the instance under ``lease`` after ``exc``, trying again while answers
    are only late and the lease lives (its renewals go on over their own connection);
    ``None`` where it must be left for recovery: the journal refuses connections (down,
    not slow), the lease is gone, or a call the run gave up on still runs."""
    iid = lease.instance_id
    if threads is None or threads.busy or not ctx.accepting:
        return None
    stores = ctx.require_stores()
    pause = 0.05
    while lease.live:
        try:
            history = await stores.journal.open(iid, token=lease.token, now=ctx.clock.store_time())
        except JournalNoAnswer:
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
            continue
        except (JournalUnavailable, FencedOut, UnknownInstance, LeaseLost):
            return None
        log.warning(
            "instance %s: a journal write had no answer (%s); re-read under the same "
            "lease (%d steps committed), running on here",
            iid,
            exc,
            len(history.steps),
        )
        return history
    return None
