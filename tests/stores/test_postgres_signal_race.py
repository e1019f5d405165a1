"""Signals racing on PostgreSQL, made to overlap for certain (R2.10).

The conformance suite sends eight signals at once; whether they overlap on the server there is
up to timing. Here a separate connection holds the instance row while the eight are sent, and
they are released only once the server shows all eight waiting behind it: eight transactions
in flight at once, each on its own connection. A store that checked the inbox outside the
instance's lock (or under a snapshot taken before it) would keep all eight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import psycopg

from flowx.stores.postgres import PostgresStores
from flowx.stores.records import InstanceState, SignalReceipt
from flowx.testing.conformance._support import at, make_instance, suspend_commit
from tests.postgres.support import aconnect
from tests.postgres_support import PG_DSN

SENDERS = 8


async def test_eight_signals_in_flight_at_once_keep_exactly_one(
    pg_schema: Callable[[], str],
) -> None:
    """R2.10: one ``woken``, seven ``duplicate``, one row in the inbox."""
    schema = pg_schema()
    # One store per sender: eight pools, so eight connections whatever a pool's size.
    senders = [PostgresStores(PG_DSN, schema=schema) for _ in range(SENDERS)]
    for s in senders:
        await s.open()
    holder = await aconnect(schema)
    try:
        iid = await make_instance(senders[0])
        await senders[0].waits.suspend(suspend_commit(iid, signal="go"))
        async with holder.transaction():
            await holder.execute(
                "SELECT 1 FROM flow_instance WHERE instance_id = %s FOR UPDATE", (iid,)
            )
            sending = [
                asyncio.ensure_future(
                    s.waits.signal(iid, "go", f'{{"n":{n}}}', key=None, now=at(6), limit=1)
                )
                for n, s in enumerate(senders)
            ]
            await _until_blocked_behind(holder, SENDERS)
        receipts: list[SignalReceipt] = await asyncio.gather(*sending)
        statuses = sorted(r.status for r in receipts)
        assert statuses == ["duplicate"] * (SENDERS - 1) + ["woken"], statuses
        [kept] = await senders[0].waits.signals(iid, "go")
        assert {r.seq for r in receipts} == {kept.seq}
        assert (await senders[0].journal.get(iid)).state is InstanceState.PENDING
    finally:
        await holder.close()
        for s in senders:
            await s.close()


# Sessions waiting behind ``pid``, directly or behind another waiter (a row lock's later
# waiters queue behind its first).
BLOCKED_BEHIND = """
WITH RECURSIVE chain(pid) AS (
    SELECT %s::int
    UNION
    SELECT a.pid FROM pg_stat_activity a JOIN chain c ON c.pid = ANY (pg_blocking_pids(a.pid))
)
SELECT count(*) - 1 FROM chain
"""


async def _until_blocked_behind(
    holder: psycopg.AsyncConnection[Any], count: int, timeout: float = 10.0
) -> None:
    """Bounded: until ``count`` server sessions wait for ``holder``'s lock."""
    pid = holder.info.backend_pid
    async with await aconnect("public") as watcher:
        deadline = time.monotonic() + timeout
        blocked = 0
        while time.monotonic() < deadline:
            row = await (await watcher.execute(BLOCKED_BEHIND, (pid,))).fetchone()
            assert row is not None
            blocked = int(row[0])
            if blocked >= count:
                return
            await asyncio.sleep(0.02)
    raise AssertionError(f"only {blocked} of {count} signals reached the server's lock queue")
