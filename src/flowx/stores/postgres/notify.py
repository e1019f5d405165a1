"""Wake-ups for other processes: NOTIFY after a commit, LISTEN in whoever waits for it.

Two channels per schema: ``outbox`` (events were staged: a publisher should claim them) and
``work`` (an instance became runnable: a queued start, a signal or a child's end that made a
parent ``Pending``, a run handed back on a drain — a worker should take it now rather than at
its next sweep).

The NOTIFY is *not* sent inside the commit. PostgreSQL serialises the commits of
notifying transactions on one lock, which would put every emitting commit of every worker in
one queue. Instead, a commit that staged events marks the notifier, and the notifier sends one
``pg_notify`` of its own after that commit has returned — at most one every ``min_interval``,
so a busy process sends a few a second, not one per commit. The receiver is sure to see the
events: they committed before the notification was sent.

A lost notification costs only latency: the publisher polls and the workers sweep.
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


#: Events were staged.
OUTBOX = "outbox"
#: An instance became runnable by any node.
WORK = "work"


def channel(schema: str, kind: str = OUTBOX) -> str:
    return f"flowx_{kind}_{schema}"


class Notifier:
    """Sends one ``pg_notify`` on ``kind``'s channel after a commit marked it, coalescing the
    marks of ``min_interval`` into one."""

    def __init__(
        self, db: PostgresDatabase, kind: str = OUTBOX, *, min_interval: float = 0.005
    ) -> None:
        self._db = db
        self._kind = kind
        self._min_interval = min_interval
        self._dirty = False
        self._task: asyncio.Task[None] | None = None

    def mark(self) -> None:
        """Called after a commit that made something for another process to do."""
        self._dirty = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        while self._dirty:
            self._dirty = False
            try:
                async with self._db.connection() as conn:
                    await conn.execute(
                        "SELECT pg_notify(%s, '')", (channel(self._db.schema, self._kind),)
                    )
            except Exception as exc:  # the receivers poll: a lost wake-up costs latency only
                log.debug("%s wake-up not sent: %s", self._kind, exc)
                return
            await asyncio.sleep(self._min_interval)

    async def close(self, *, flush: float = 1.0) -> None:
        """Stop; a wake-up still to send gets up to ``flush`` seconds first, so a short-lived
        process (``flowx start``, ``flowx signal``) does not exit with its wake-up unsent."""
        if self._task is None or self._task.done():
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._task), timeout=flush)
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class Listener:
    """One LISTEN connection per process and channel, opened on first use; reconnects after
    a failure. The first ``wait`` returns only once the LISTEN is in place (or its connection
    failed), so a notification sent after it returns is never missed for want of a listener;
    its ``timeout`` counts from then."""

    def __init__(self, db: PostgresDatabase, kind: str = OUTBOX) -> None:
        self._db = db
        self._kind = kind
        self._event = asyncio.Event()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def wait(self, timeout: float) -> bool:
        if self._task is None or self._task.done():
            self._ready.clear()
            self._task = asyncio.get_running_loop().create_task(self._listen())
            await self._ready.wait()
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
                        sql.SQL("LISTEN {}").format(
                            sql.Identifier(channel(self._db.schema, self._kind))
                        )
                    )
                    self._ready.set()
                    async for _ in conn.notifies():
                        self._event.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("%s LISTEN connection lost (%s); reconnecting", self._kind, exc)
                self._event.set()  # poll once now: a notification may have been missed
                self._ready.set()
                await asyncio.sleep(1.0)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
