"""Wake-ups for publishers in other processes: NOTIFY after staging, LISTEN in the publisher.

The NOTIFY is *not* sent inside the step commit. PostgreSQL serialises the commits of
notifying transactions on one lock, which would put every emitting commit of every worker in
one queue. Instead, a commit that staged events marks the notifier, and the notifier sends one
``pg_notify`` of its own after that commit has returned — at most one every ``min_interval``,
so a busy process sends a few a second, not one per commit. The receiver is sure to see the
events: they committed before the notification was sent.

A lost notification costs only latency: the publisher also polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import psycopg
from psycopg import sql

from flowx.stores.postgres.database import PostgresDatabase

log = logging.getLogger("flowx.postgres")


def channel(schema: str) -> str:
    return f"flowx_outbox_{schema}"


class StagedNotifier:
    def __init__(self, db: PostgresDatabase, *, min_interval: float = 0.005) -> None:
        self._db = db
        self._min_interval = min_interval
        self._dirty = False
        self._task: asyncio.Task[None] | None = None

    def staged(self) -> None:
        self._dirty = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        while self._dirty:
            self._dirty = False
            try:
                async with self._db.connection() as conn:
                    await conn.execute("SELECT pg_notify(%s, '')", (channel(self._db.schema),))
            except Exception as exc:  # the publisher polls: a lost wake-up costs latency only
                log.debug("outbox wake-up not sent: %s", exc)
                return
            await asyncio.sleep(self._min_interval)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class StagedListener:
    """One LISTEN connection per process, opened on first use; reconnects after a failure."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def wait(self, timeout: float) -> bool:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._listen())
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return False
        self._event.clear()
        return True

    async def _listen(self) -> None:
        while True:
            try:
                conn: Any = await psycopg.AsyncConnection.connect(
                    self._db.dsn, autocommit=True, connect_timeout=5
                )
                async with conn:
                    await conn.execute(
                        sql.SQL("LISTEN {}").format(sql.Identifier(channel(self._db.schema)))
                    )
                    async for _ in conn.notifies():
                        self._event.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("outbox LISTEN connection lost (%s); reconnecting", exc)
                self._event.set()  # poll once now: a notification may have been missed
                await asyncio.sleep(1.0)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
