"""Lease releases batched: every release that arrives while one batch is on the wire goes in
the next, as one statement.

A run releases its lease once it has ended; on a busy node that is one round trip per flow,
which is why releases are batched like commits. They are not folded into the terminal commit:
that would lock the lease row for the commit's WAL flush, and the node's renewals — which lock
every lease it holds — would queue behind slow commits, exactly what keeps a node from
losing live leases on a slow disk (R9.1).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from flowx.stores.records import Lease

Batch = Sequence[tuple[Lease, datetime | None]]


class ReleaseBatcher:
    """Queues releases and sends them through ``send``, one batch at a time."""

    def __init__(self, send: Callable[[Batch], Awaitable[None]], *, max_batch: int = 512) -> None:
        self._send = send
        self._max_batch = max_batch
        self._pending: list[tuple[Lease, datetime | None, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None

    async def release(self, lease: Lease, now: datetime | None) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append((lease, now, future))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._flush(), name="flowx-lease-releases")
        await future

    async def _flush(self) -> None:
        while self._pending:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            try:
                await self._send([(lease, now) for lease, now, _ in batch])
            except BaseException as exc:
                for *_, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            for *_, future in batch:
                if not future.done():
                    future.set_result(None)
