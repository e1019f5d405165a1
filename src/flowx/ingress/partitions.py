"""Partitions of a RabbitMQ ingress queue shared fairly by competing workers (issue 18 item 1).

``?partitions=N`` (``flowx.ingress.rabbitmq``) splits a queue into N ordered partitions, one
tenant per partition. Each partition must have exactly one consumer at a time, taking one
message at a time, or a tenant's second message could start before its first is committed.
RabbitMQ's single active consumer gives the "one at a time" but not the spread: on this
broker's versions it makes the *first* consumer registered active, so the first worker up
would take every partition and the others would idle as standbys. So a worker here *claims*
partitions instead:

* **A claim** is an exclusive consumer (``basic.consume exclusive``) on the partition's queue,
  on a channel of its own with prefetch 1. The broker refuses a second exclusive consumer, so
  two workers never consume one partition, and the worker knows exactly what it holds.
* **A fair share.** Every worker also consumes (and never receives from) one presence queue,
  ``<queue>.workers``; its consumer count is the number of live workers W. Every
  ``BALANCE_EVERY`` seconds a worker holding more than ceil(N / W) partitions releases the
  extra ones, and one holding fewer claims free ones (starting at a random partition, so
  workers do not all race for the same one). The shares add up to at least N, so every
  partition always has a worker with room for it: none is left unconsumed.
* **A release keeps order.** A released partition takes no new message; the one being
  handled finishes and is acked; then its channel is closed, which returns any message the
  broker had pushed meanwhile (unhandled) to the head of the queue — so the next holder
  starts exactly where this one stopped. A worker that dies (SIGKILL) loses its connection:
  RabbitMQ requeues its unacked message at the head, and another worker claims the partition
  within ``BALANCE_EVERY``; the idempotency key makes a redelivered start return its instance.
* **A connection of its own**, not aio-pika's robust one: a robust connection would restore
  the exclusive consumers by itself after a reconnect, and one another worker claimed
  meanwhile would be refused over and over. When this connection is lost, the broker has
  already requeued what it held; the next balance connects again and claims afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any, Final

log = logging.getLogger("flowx.ingress")

#: How often a worker looks at its share: the most a freed partition waits for a new holder.
BALANCE_EVERY: Final = 0.5

OnMessage = Callable[[Any], Awaitable[None]]


class _Held:
    """One claimed partition: its channel, consumer tag, and whether a message is in hand."""

    def __init__(self, channel: Any, queue: Any) -> None:
        self.channel = channel
        self.queue = queue
        self.tag = ""
        self.releasing = False
        self.idle = asyncio.Event()
        self.idle.set()


class PartitionClaims:
    """The partitions (``queues``) this worker consumes, over a connection of its own to
    ``url`` (see the module docstring); each claimed message goes to ``on_message``."""

    def __init__(
        self,
        url: str,
        timeout: float,
        queues: list[str],
        members: str,
        on_message: OnMessage,
        name: str,
    ) -> None:
        self._url = url
        self._timeout = timeout
        self._connection: Any = None
        self._queues = queues
        self._members = members
        self._on_message = on_message
        self._name = name
        self._held: dict[str, _Held] = {}
        self._control: Any = None
        self._loop: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    @property
    def held(self) -> list[str]:
        """The partitions this worker consumes now, in partition order."""
        return [q for q in self._queues if q in self._held and not self._held[q].releasing]

    async def start(self) -> None:
        """Join (consume the presence queue), take a first share, then keep balancing."""
        self._stopping.clear()
        await self.balance()
        self._loop = asyncio.create_task(self._keep_balancing())

    async def _join(self) -> None:
        """Connect (again) and consume the presence queue: this worker counts from now."""
        import aio_pika

        self._held.clear()  # what a lost connection held, the broker has requeued
        if self._connection is not None:  # lost, or half set up by a join that failed
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._connection.close(), self._timeout)
            self._connection = None
        self._connection = await aio_pika.connect(self._url, timeout=self._timeout)
        self._control = await self._connection.channel()
        members = await self._control.declare_queue(self._members, auto_delete=True)
        await members.consume(_ignore)

    async def stop(self, timeout: float) -> None:
        """Release every partition (each after its message in hand, within ``timeout``)."""
        self._stopping.set()
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        await asyncio.gather(*(self._release(q, timeout) for q in list(self._held)))
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), self._timeout)

    async def _keep_balancing(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), BALANCE_EVERY)
            if self._stopping.is_set():
                return
            try:
                await self.balance()
            except Exception as exc:  # the link is lost (or broken): start afresh next time
                log.warning("%s: partitions not balanced now: %r", self._name, exc)
                self._held.clear()  # the broker requeues what a lost connection held
                connection, self._connection = self._connection, None
                if connection is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(connection.close(), self._timeout)

    async def balance(self) -> None:
        """Release down to, or claim up to, this worker's share of the partitions."""
        if self._connection is None or self._connection.is_closed:
            await self._join()
        channel = await self._control.get_underlay_channel()
        declared = await channel.queue_declare(self._members, passive=True)
        workers = max(1, int(declared.consumer_count or 0))
        share = math.ceil(len(self._queues) / workers)
        held = self.held
        for name in held[share:]:
            await self._release(name, None)
        if len(held) >= share:
            return
        start = random.randrange(len(self._queues))  # nosec B311  # spreading, not security
        for name in self._queues[start:] + self._queues[:start]:
            if len(self.held) >= share or self._stopping.is_set():
                return
            if name not in self._held:
                await self._claim(name)

    async def _claim(self, name: str) -> bool:
        """Consume ``name`` exclusively; False if another worker holds it."""
        from aiormq import exceptions

        channel = await self._connection.channel()
        await channel.set_qos(prefetch_count=1)
        queue = await channel.get_queue(name, ensure=False)
        held = _Held(channel, queue)
        try:
            held.tag = await queue.consume(self._taker(name, held), exclusive=True)
        except exceptions.ChannelAccessRefused:
            with contextlib.suppress(Exception):
                await channel.close()
            return False
        self._held[name] = held
        log.info("%s: consuming partition %s", self._name, name)
        return True

    def _taker(self, name: str, held: _Held) -> OnMessage:
        async def take(message: Any) -> None:
            if held.releasing:  # left unacked: closing the channel puts it back at the head
                return
            held.idle.clear()
            try:
                await self._on_message(message)
            finally:
                held.idle.set()

        return take

    async def _release(self, name: str, timeout: float | None) -> None:
        """Stop taking from ``name``: finish the message in hand, then close the channel."""
        held = self._held.get(name)
        if held is None:
            return
        held.releasing = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(held.idle.wait(), timeout)
        self._held.pop(name, None)
        with contextlib.suppress(Exception):
            await held.channel.close()
        log.info("%s: released partition %s", self._name, name)


async def _ignore(message: Any) -> None:
    """The presence queue carries no messages; one sent there by mistake is dropped."""
    with contextlib.suppress(Exception):
        await message.reject(requeue=False)
