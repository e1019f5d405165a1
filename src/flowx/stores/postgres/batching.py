"""Group writes: what arrives while earlier batches are in flight goes out together (R6.2).

The pattern of the step committer (commit.py), for the other writes of the hot path — starts
(creates.py), suspends (suspends.py), signal deliveries (signals.py) — and its hot reads
(reads.py): one write goes out at once, alone, when nothing is in flight; batches form only
behind earlier ones, which is exactly when waiting costs nothing.
One key never appears twice in a batch (a second write for one instance waits for the next).
A batch that fails on one write's data (``isolatable``) is retried write by write, so only that
write fails; any other failure (a lost connection: the outcome is unknown) fails the batch.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

import psycopg

log = logging.getLogger("flowx.postgres")

T = TypeVar("T")
R = TypeVar("R")


def isolatable(exc: Exception) -> bool:
    """Whether a batch that raised ``exc`` wrote nothing and may be retried commit by commit.

    True for an error about the data of one commit (R9.5): anything the server refused with
    the statement (``DataError`` — an invalid byte sequence, an untranslatable character, text
    the ``json`` type refuses —, ``IntegrityError``, ...), a deadlock or serialisation failure
    (the transaction was rolled back), and a ``str`` the driver could not encode (nothing was
    sent). False for anything else — a connection that failed, a statement cancelled or timed
    out (``OperationalError``, ``InterfaceError``, ``TimeoutError``, ``OSError``): whether the
    batch committed is unknown, so it is not sent again.
    """
    if isinstance(  # rolled back; psycopg makes these plain OperationalErrors, so named here
        exc,
        psycopg.errors.DeadlockDetected
        | psycopg.errors.SerializationFailure
        | psycopg.errors.TransactionRollback,
    ):
        return True
    if isinstance(exc, psycopg.DatabaseError):
        return not isinstance(exc, psycopg.OperationalError)
    return isinstance(exc, UnicodeError)


class Batcher(Generic[T, R]):
    """Queues writes and sends them ``max_batch`` at a time, ``max_inflight`` batches at once.

    ``one`` sends one write alone; ``many`` sends a batch of two or more in one statement and
    returns each write's outcome. ``key`` says which writes may not share a batch (the same
    instance); ``group`` which may (the same owner and TTL, say): a batch is the oldest write
    and those behind it of its group (no ``group``: any may).

    A second batch goes out beside one in flight only once ``spill`` writes wait: below that,
    they wait for it and leave as one statement (measured: parks/s on PostgreSQL 1.3x those
    of four lanes open to any write; benchmarks/waits.py). A batch held up — a reply that
    never comes, a row lock someone else holds — still lets the rest through: once they pile
    up behind it, or once it has been out for ``patience`` seconds (a healthy batch takes a
    few milliseconds), whichever comes first."""

    def __init__(
        self,
        one: Callable[[T], Awaitable[R]],
        many: Callable[[list[T]], Awaitable[Sequence[R | Exception]]],
        *,
        key: Callable[[T], Hashable],
        group: Callable[[T], Hashable] | None = None,
        max_batch: int = 256,
        max_inflight: int = 4,
        spill: int = 32,
        patience: float = 0.02,
    ) -> None:
        self._one, self._many = one, many
        self._key, self._group = key, group
        self._max_batch, self._max_inflight = max_batch, max_inflight
        self._spill, self._patience = spill, patience
        self._timer: asyncio.TimerHandle | None = None
        self._pending: deque[tuple[T, asyncio.Future[R]]] = deque()
        self._inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0
        self.batched = 0
        #: Batches that failed on one write's data and were retried write by write.
        self.fallbacks = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def _running(self) -> asyncio.AbstractEventLoop:
        """The loop the writes come from: the one found last while it still runs (a store's
        connections serve one loop at a time). Asked anew, ``asyncio.get_running_loop``
        costs a ``getpid`` system call on CPython 3.11, and this runs on every step commit.
        A patience timer armed on a loop that has gone fires nowhere: forgotten with it."""
        loop = self._loop
        if loop is None or not loop.is_running():
            found = asyncio.get_running_loop()
            if found is not loop:
                self._timer = None
            loop = self._loop = found
        return loop

    def submit(self, item: T) -> asyncio.Future[R]:
        """``item``'s outcome once its batch is answered: a future to await, not a coroutine
        around one (a frame less to create and pass through on every step commit)."""
        future: asyncio.Future[R] = self._running().create_future()
        self._pending.append((item, future))
        self._dispatch()
        return future

    def _dispatch(self, *, overdue: bool = False) -> None:
        while self._pending and self._inflight < self._max_inflight:
            if self._inflight and len(self._pending) < self._spill and not overdue:
                # Wait for the batch in flight — but not for a hung one: past ``patience``
                # the writes behind it take a lane of their own (R9.1).
                if self._timer is None:
                    self._timer = self._running().call_later(self._patience, self._overdue)
                return
            overdue = False
            batch = self._take()
            self._inflight += 1
            # A context of its own: a batch serves many instances, so it carries no one
            # caller's span (``flowx.tracing``).
            task = self._running().create_task(self._run(batch), context=contextvars.Context())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _overdue(self) -> None:
        self._timer = None
        self._dispatch(overdue=True)

    def _take(self) -> list[tuple[T, asyncio.Future[R]]]:
        grouped = self._group
        group = grouped(self._pending[0][0]) if grouped is not None else None
        batch: list[tuple[T, asyncio.Future[R]]] = []
        seen: set[Hashable] = set()
        kept: list[tuple[T, asyncio.Future[R]]] = []
        key_of = self._key
        while self._pending and len(batch) < self._max_batch:
            entry = self._pending.popleft()
            key = key_of(entry[0])
            if key in seen or (grouped is not None and grouped(entry[0]) != group):
                kept.append(entry)
                continue
            seen.add(key)
            batch.append(entry)
        self._pending.extendleft(reversed(kept))
        return batch

    async def _run(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            await self._execute(batch)
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        finally:
            self._inflight -= 1
            self._dispatch()

    async def _execute(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        if len(batch) > 1:
            try:
                outcomes = await self._many([item for item, _ in batch])
            except Exception as exc:
                if not isolatable(exc):
                    raise
                self.fallbacks += 1
                log.debug("a batch of %d fell back to single writes: %s", len(batch), exc)
            else:
                self.batches += 1
                self.batched += len(batch)
                for (_, future), outcome in zip(batch, outcomes, strict=True):
                    if future.done():
                        continue
                    if isinstance(outcome, Exception):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
                return
        for item, future in batch:
            if future.done():
                continue
            try:
                future.set_result(await self._one(item))
            except Exception as exc:
                future.set_exception(exc)
