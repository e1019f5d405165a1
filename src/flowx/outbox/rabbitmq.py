"""RabbitMQ: one exchange, routed by event type, with publisher confirms (R5.4).

The batch is written in order on one confirming channel and the confirms are awaited
together, so a batch costs about one round trip. The acknowledged prefix is the run of
confirms from the start of the batch up to the first that is missing or negative; what
follows goes out again (a duplicate where the broker took it; consumers deduplicate by
``event_id``).

Messages are published ``mandatory``: a message no queue is bound for comes back as a
return, which is a permanent refusal rather than a silent drop. So are a missing exchange
(``NOT_FOUND``) and a message over the broker's size limit (``PRECONDITION_FAILED``). A
negative confirm (a full queue with ``x-overflow: reject-publish``), a lost connection or a
timeout is transient. A channel or connection the broker closed is opened again on the next
publish.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from flowx.outbox.publisher import PublishFailure, PublishResult, headers
from flowx.redaction import guard_logs, redact
from flowx.stores.records import EventRecord


def _by_type(event: EventRecord) -> str:
    return event.type


class RabbitMQPublisher:
    """Publish each event to ``exchange`` with routing key ``routing_key(event)``."""

    def __init__(
        self,
        url: str,
        *,
        exchange: str = "flowx.events",
        exchange_type: str = "topic",
        routing_key: Callable[[EventRecord], str] = _by_type,
        timeout: float = 5.0,
    ) -> None:
        self.url = url
        self.exchange_name = exchange
        self._exchange_type = exchange_type
        self._routing_key = routing_key
        self._timeout = timeout
        self._connection: Any = None
        self._channel: Any = None
        self._exchange: Any = None

    @property
    def name(self) -> str:
        return "rabbitmq"

    async def open(self) -> None:
        async with asyncio.timeout(self._timeout):
            await self._ensure_open()

    async def _ensure_open(self) -> Any:
        import aio_pika

        if self._connection is None or self._connection.is_closed:
            await self._drop()
            # aio-pika and aiormq log the URL they connect to at DEBUG, masking a userinfo
            # password but not a ``?password=``: their lines go through ``redact`` (R9.8).
            guard_logs("aio_pika", "aiormq", "flowx")
            self._connection = await aio_pika.connect(self.url, timeout=self._timeout)
        if self._channel is None or self._channel.is_closed:
            self._exchange = None
            self._channel = await self._connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
        if self._exchange is None:
            self._exchange = await self._channel.declare_exchange(
                self.exchange_name, aio_pika.ExchangeType(self._exchange_type), durable=True
            )
        return self._exchange

    async def _drop(self) -> None:
        connection, self._connection, self._channel, self._exchange = (
            self._connection,
            None,
            None,
            None,
        )
        if connection is not None and not connection.is_closed:
            with contextlib.suppress(Exception):
                await connection.close()

    async def close(self) -> None:
        await self._drop()

    async def publish(self, events: Sequence[EventRecord]) -> PublishResult:
        import aio_pika

        if not events:
            return PublishResult(0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        try:
            async with asyncio.timeout_at(deadline):
                exchange = await self._ensure_open()
        except Exception as exc:
            await self._drop()
            shown = redact(repr(exc), secrets_of=(self.url,), limit=None)
            if _permanent(exc):
                return PublishResult(0, PublishFailure(f"RabbitMQ refused: {shown}", True))
            return PublishResult(0, PublishFailure(f"RabbitMQ unavailable: {shown}", False))

        tasks = [
            asyncio.ensure_future(
                exchange.publish(
                    aio_pika.Message(
                        e.payload.encode(),
                        message_id=e.event_id,
                        type=e.type,
                        content_type="application/json",
                        headers=dict(headers(e)),
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    ),
                    routing_key=self._routing_key(e),
                    mandatory=True,
                )
            )
            for e in events
        ]
        await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()))
        result, stale = PublishResult(len(events)), False
        for i, task in enumerate(tasks):
            if not task.done():
                reason = f"RabbitMQ did not confirm within {self._timeout}s"
                result, stale = PublishResult(i, PublishFailure(reason, False)), True
                break
            error = task.exception()
            if error is not None:
                result = PublishResult(i, _failure(error, self.url))
                break
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if stale or self._channel is None or self._channel.is_closed:
            # A closed channel is useless, and a timed-out one may yet deliver confirms for
            # messages reported unacknowledged: the next batch starts on a fresh connection.
            await self._drop()
        return result


def _permanent(exc: BaseException) -> bool:
    from aiormq import exceptions

    return isinstance(
        exc,
        exceptions.PublishError
        | exceptions.ChannelNotFoundEntity
        | exceptions.ChannelPreconditionFailed
        | exceptions.ChannelAccessRefused,
    )


def _failure(exc: BaseException, url: str) -> PublishFailure:
    """Why a message was not confirmed; a driver's text never carries the URL's secrets (a
    reason is stored with the event and shown by ``flowx outbox``)."""
    from aiormq import exceptions

    text = redact(str(exc), secrets_of=(url,), limit=None)
    shown = redact(repr(exc), secrets_of=(url,), limit=None)
    if isinstance(exc, exceptions.PublishError):
        return PublishFailure(f"RabbitMQ returned the message as unroutable: {text}", True)
    if _permanent(exc):
        return PublishFailure(f"RabbitMQ refused: {shown}", True)
    if isinstance(exc, exceptions.DeliveryError):
        return PublishFailure(f"RabbitMQ did not accept the message: {text}", False)
    return PublishFailure(f"RabbitMQ unavailable: {shown}", False)
