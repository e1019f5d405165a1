"""RabbitMQ ingress: a worker consumes one queue; each message starts an instance or delivers a
signal (R6.1, R9.9), through ``flowx.ingress.core``.

The URL names the queue: ``amqp://user:pass@host:5672/vhost?queue=orders`` (``amqps://`` for
TLS). Optional parameters: ``dead=`` the dead-letter exchange and queue (``<queue>.dead`` by
default), ``prefetch=`` the most unacknowledged messages this worker holds (64 by default,
never above the host's ``max_concurrent_flows``), ``ordered=true`` and ``partitions=N``
(below). FlowX takes these off before aio-pika sees the URL.

* **Declared at start.** The queue, durable; a fanout exchange and a durable queue, both named
  ``dead``, bound together. A queue declared beforehand must be durable with no arguments
  FlowX would contradict (RabbitMQ refuses a redeclaration that differs).
* **Acked after the commit.** A message is acked only once ``IngressDispatcher.handle`` has
  returned, so the start (or signal) is in the journal; a worker killed before its ack loses
  nothing: RabbitMQ redelivers the message and its idempotency key returns the instance the
  first delivery started (R4.1).
* **Poison.** A ``Dead`` verdict is published to the dead-letter exchange — the original body,
  headers and routing key, plus ``flowx-dead-code`` and ``flowx-dead-reason`` — with publisher
  confirms, and only then is the original acked. If that publish fails the original is not
  acked: it is requeued after a backoff and judged again.
* **Our side down.** ``IngressRetry`` (journal or lease store unreachable, host draining): the
  message is held for a backoff (0.5 s doubling to 30 s while failures continue; holding it
  keeps this worker from pulling more) and then requeued, never dead-lettered.
* **Backpressure.** QoS prefetch is at most the host's ``max_concurrent_flows``, and a message
  waits before its start until the host has a free slot (``max_concurrent_flows`` minus the
  instances in flight and the messages being handled): a full worker holds at most its
  prefetch and RabbitMQ gives the rest of the queue to the other workers (competing consumers).
* **In order.** ``ordered=true`` declares the queue with ``x-single-active-consumer`` and
  takes one message at a time (prefetch 1): of the workers on the queue one consumes, in
  queue order, and another takes over when it goes. A queue declared beforehand without
  that argument is refused by RabbitMQ (``ingress.refused``).
* **In order per tenant, with competing workers.** ``partitions=N`` (1 to 256) declares an
  ``x-consistent-hash`` exchange named like the queue (``orders``), hashing on the message
  header ``flowx-tenant``, and N durable queues ``orders.p0`` .. ``orders.p<N-1>`` bound to
  it with equal weight. Producers publish to the exchange ``orders``, the tenant in
  ``flowx-tenant`` and the routing key naming the flow as before; a message without the
  header hashes as if it had an empty one (one partition for all such). The workers share
  the partitions fairly, each consumed by one worker at a time, one message at a time
  (``flowx.ingress.partitions``: exclusive claims, a presence queue ``orders.workers``): each
  tenant's messages are started in publish order, and when a worker goes the others take
  its partitions over where it stopped. Needs RabbitMQ's plugin
  ``rabbitmq_consistent_hash_exchange`` (``ingress.refused`` names the command to enable it).
  N is fixed for a queue: another N rebinds the exchange and moves tenants between
  partitions, so drain the queues before changing it.
* **Reconnects.** The connection is aio-pika's robust one: after a broker restart it reconnects
  and consumes again; messages unacked on the lost connection are redelivered by RabbitMQ.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Final

from flowx.errors import FlowXError
from flowx.ingress.core import (
    DEAD_CODE_HEADER,
    DEAD_REASON_HEADER,
    Dead,
    Delivery,
    IngressDispatcher,
    IngressRetry,
)
from flowx.ingress.partitions import PartitionClaims
from flowx.redaction import guard_logs, redact
from flowx.urls import BadURL, check_text, split, take_params

log = logging.getLogger("flowx.ingress")

_CODE: Final = "ingress.bad_url"
_PARAMS: Final = frozenset({"queue", "dead", "prefetch", "ordered", "partitions"})
DEFAULT_PREFETCH: Final = 64
#: The header a partitioned queue's consistent-hash exchange hashes on (one tenant, one
#: partition); a message without it hashes as if it had one empty value.
TENANT_HEADER: Final = "flowx-tenant"
#: The most partitions one URL may ask for: each is a queue and a consumer on every worker.
MOST_PARTITIONS: Final = 256
#: Each partition's weight in the consistent-hash exchange: its points on the hash ring.
RING_POINTS: Final = 100
#: Backoff before a message our side could not take is requeued: first, and most.
BACKOFF_FIRST: Final = 0.5
BACKOFF_MOST: Final = 30.0
#: How often a message waiting for a free flow slot looks again.
_SLOT_POLL: Final = 0.05


class RabbitMQIngress:
    """Consume the queue named by ``url`` into a node (see the module docstring)."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        check_text(url, "ingress")
        shown = redact(url)
        if split(url, "ingress", code=_CODE).scheme not in ("amqp", "amqps"):
            raise BadURL(f"ingress URL {shown!r} is not amqp:// or amqps://", url=shown, code=_CODE)
        self._url, params = take_params(url, lambda name: name in _PARAMS)
        self.queue = _name(params.get("queue"), "queue", shown)
        self.dead = _name(params.get("dead", f"{self.queue}.dead"), "dead", shown)
        self.ordered = _flag(params.get("ordered"), "ordered", shown)
        self.prefetch = _prefetch(params.get("prefetch"), shown)
        self.partitions = _partitions(params, shown)
        if self.partitions:
            self.ordered = True  # each partition is an ordered queue
        if self.ordered and params.get("prefetch", "1") != "1":
            raise BadURL(
                f"ingress URL {shown!r}: ordered=true takes one message at a time (so does each "
                "partition of partitions=); drop prefetch=",
                url=shown,
                code=_CODE,
            )
        if self.ordered:
            self.prefetch = 1
        self._timeout = timeout
        self._dispatcher: IngressDispatcher | None = None
        self._connection: Any = None
        self._consuming: list[tuple[Any, str]] = []  # (queue, consumer tag) per queue
        self._claims: PartitionClaims | None = None
        self._dead_exchange: Any = None
        self._stopping = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._active = 0
        self._admitted = 0  # messages past _free_slot, not yet handled
        self._failures = 0
        self._connecting: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return f"rabbitmq queue {self.queue!r}"

    @property
    def queues(self) -> list[str]:
        """The queues this worker consumes: the queue, or its partitions ``<queue>.p0`` ..
        ``<queue>.p<N-1>`` (fed by the consistent-hash exchange named ``<queue>``)."""
        if not self.partitions:
            return [self.queue]
        return [f"{self.queue}.p{i}" for i in range(self.partitions)]

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, dispatcher: IngressDispatcher) -> None:
        """Connect, declare, consume. A broker that refuses us (credentials, a vhost, a queue
        declared otherwise) raises; one that is down is retried in the background."""
        self._dispatcher = dispatcher
        self._stopping.clear()
        try:
            await self._connect()
        except FlowXError:
            raise
        except Exception as exc:
            log.warning(
                "%s: RabbitMQ not reached, retrying in the background: %s",
                self.name,
                self._shown(exc),
            )
            self._connecting = asyncio.create_task(self._keep_connecting())

    async def _keep_connecting(self) -> None:
        delay = BACKOFF_FIRST
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            if self._stopping.is_set():
                return
            try:
                await self._connect()
            except Exception as exc:
                delay = min(delay * 2, BACKOFF_MOST)
                log.warning("%s: RabbitMQ still not reached: %s", self.name, self._shown(exc))
            else:
                log.info("%s: connected, consuming", self.name)
                return

    async def _connect(self) -> None:
        import aio_pika
        from aiormq import exceptions

        # aio-pika and aiormq may log the URL they connect to: their lines are redacted (R9.8).
        guard_logs("aio_pika", "aiormq", "flowx")
        assert self._dispatcher is not None  # nosec B101  # set by start
        try:
            connection = await aio_pika.connect_robust(self._url, timeout=self._timeout)
        except (exceptions.ProbableAuthenticationError, exceptions.ConnectionNotAllowed) as exc:
            raise FlowXError(
                f"{self.name}: RabbitMQ refused the login: {self._shown(exc)}; check the user, "
                "password and vhost in the --ingress URL",
                code="ingress.refused",
            ) from exc
        try:
            consuming = await connection.channel()
            await consuming.set_qos(prefetch_count=self._prefetch_bound())
            confirming = await connection.channel(publisher_confirms=True, on_return_raises=True)
            dead_exchange = await confirming.declare_exchange(
                self.dead, aio_pika.ExchangeType.FANOUT, durable=True
            )
            dead_queue = await confirming.declare_queue(self.dead, durable=True)
            await dead_queue.bind(dead_exchange)
            # A partition is claimed by one exclusive consumer (flowx.ingress.partitions).
            ordered = self.ordered and not self.partitions
            queues = [
                await consuming.declare_queue(
                    name,
                    durable=True,
                    arguments={"x-single-active-consumer": True} if ordered else None,
                )
                for name in self.queues
            ]
            self._dead_exchange, self._connection = dead_exchange, connection
            if self.partitions:
                await bind_partitions(consuming, self.queue, queues)
                claims = PartitionClaims(
                    self._url,
                    self._timeout,
                    self.queues,
                    f"{self.queue}.workers",
                    self._on_message,
                    self.name,
                )
                await claims.start()
                self._claims = claims
            else:
                for queue in queues:
                    self._consuming.append((queue, await queue.consume(self._on_message)))
        except exceptions.ConnectionCommandInvalid as exc:  # e.g. the hash exchange's plugin is off
            with contextlib.suppress(Exception):
                await connection.close()
            raise FlowXError(
                f"{self.name}: RabbitMQ refused to set up the queues: {self._shown(exc)}"
                + (PLUGIN_HINT if self.partitions else ""),
                code="ingress.refused",
            ) from exc
        except exceptions.ChannelClosed as exc:  # a precondition, an access refusal: no retry helps
            with contextlib.suppress(Exception):
                await connection.close()
            raise FlowXError(
                f"{self.name}: RabbitMQ refused to set up the queues: {self._shown(exc)}",
                code="ingress.refused",
            ) from exc
        except BaseException:
            with contextlib.suppress(Exception):
                await connection.close()
            raise

    def _prefetch_bound(self) -> int:
        assert self._dispatcher is not None  # nosec B101  # set by start
        return max(1, min(self.prefetch, self._dispatcher.host.settings.max_concurrent_flows))

    async def stop(self, timeout: float) -> None:
        """Stop consuming, let the handles in flight finish within ``timeout``, close. What is
        still unacked is requeued by RabbitMQ when the connection closes."""
        self._stopping.set()
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connecting
            self._connecting = None
        claims, self._claims = self._claims, None
        if claims is not None:
            await claims.stop(timeout)
        consuming, self._consuming = self._consuming, []
        for queue, tag in consuming:
            if not self._connection.is_closed:
                await _quietly(queue.cancel(tag), self._timeout)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        connection, self._connection = self._connection, None
        if connection is not None and not connection.is_closed:
            await _quietly(connection.close(), self._timeout)

    # -- one message -----------------------------------------------------------------------

    async def _on_message(self, message: Any) -> None:
        self._active += 1
        self._idle.clear()
        try:
            await self._take(message)
        except Exception as exc:  # the ack or nack itself failed: the channel is gone
            log.info(
                "%s: message %s left for redelivery: %s",
                self.name,
                redact(str(message.message_id)),
                self._shown(exc),
            )
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    async def _take(self, message: Any) -> None:
        dispatcher = self._dispatcher
        assert dispatcher is not None  # nosec B101  # consuming starts after start()
        if not await self._free_slot(dispatcher):
            await message.nack(requeue=True)  # stopping: another worker takes it
            return
        try:
            await self._admitted_take(dispatcher, message)
        finally:
            self._admitted -= 1

    async def _admitted_take(self, dispatcher: IngressDispatcher, message: Any) -> None:
        delivery = Delivery(
            body=message.body,
            message_id=message.message_id,
            headers=text_headers(message.headers),
            subject=message.routing_key or "",
            redelivered=bool(message.redelivered),
        )
        try:
            verdict = await dispatcher.handle(delivery)
        except IngressRetry as exc:
            await self._later(message, exc.message)
            return
        if isinstance(verdict, Dead) and not await self._dead_letter(message, verdict):
            await self._later(message, "the dead-letter publish was not confirmed")
            return
        self._failures = 0
        await message.ack()

    async def _free_slot(self, dispatcher: IngressDispatcher) -> bool:
        """Wait until the host can run one more instance (this message's), then count it
        admitted (the caller uncounts it once handled); False if stopping. Only the admitted
        messages count against the free slots, not the ones waiting here: a worker may hold
        more messages than slots (one per partition), and waiting ones counted would wait on
        each other for ever."""
        while dispatcher.free_slots() - self._admitted <= 0:
            if self._stopping.is_set():
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), _SLOT_POLL)
        if self._stopping.is_set():
            return False
        self._admitted += 1
        return True

    async def _later(self, message: Any, why: str) -> None:
        """Requeue ``message`` after a backoff that grows while failures go on (never at once:
        a journal that is down would be hammered by the same messages)."""
        self._failures += 1
        delay = min(BACKOFF_FIRST * 2 ** (self._failures - 1), BACKOFF_MOST)
        log.warning(
            "%s: message %s requeued in %.1fs: %s",
            self.name,
            redact(str(message.message_id)),
            delay,
            why,
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), delay)
        await message.nack(requeue=True)

    async def _dead_letter(self, message: Any, verdict: Dead) -> bool:
        """Publish the poison message to the dead-letter exchange, confirmed; True once the
        broker has it (and only then may the original be acked)."""
        import aio_pika

        headers: dict[str, Any] = dict(message.headers or {})
        headers[DEAD_CODE_HEADER] = verdict.code
        headers[DEAD_REASON_HEADER] = verdict.reason
        headers["flowx-dead-queue"] = self.queue
        headers["flowx-dead-routing-key"] = message.routing_key or ""
        dead = aio_pika.Message(
            message.body,
            headers=headers,
            message_id=message.message_id,
            correlation_id=message.correlation_id,
            content_type=message.content_type,
            timestamp=message.timestamp,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        try:
            async with asyncio.timeout(self._timeout):
                await self._dead_exchange.publish(
                    dead, routing_key=message.routing_key or self.queue, mandatory=True
                )
        except Exception as exc:
            log.warning("%s: dead-letter publish failed: %s", self.name, self._shown(exc))
            return False
        return True

    def _shown(self, exc: BaseException) -> str:
        return redact(repr(exc), secrets_of=(self._url,), limit=None)


async def _quietly(call: Any, timeout: float) -> None:
    """Await a closing call on a connection that may be gone: aiormq then fails it, even with
    ``CancelledError``, which is swallowed unless this task itself is being cancelled."""
    try:
        await asyncio.wait_for(call, timeout)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
    except Exception as exc:
        log.debug("closing RabbitMQ ingress: %r", exc)


def text_headers(headers: Mapping[str, Any] | None) -> dict[str, str]:
    """AMQP header values as text: bytes decoded (undecodable bytes replaced), others by
    ``str``. The core reads only a handful of ``flowx-*`` headers, all text."""
    out: dict[str, str] = {}
    for key, value in (headers or {}).items():
        if isinstance(value, bytes):
            out[key] = value.decode("utf-8", errors="replace")
        elif isinstance(value, str):
            out[key] = value
        elif value is not None:
            out[key] = str(value)
    return out


def _name(value: str | None, param: str, shown: str) -> str:
    """A queue or exchange name FlowX may declare: given, at most 200 characters, not
    RabbitMQ's reserved ``amq.`` prefix."""
    if not value:
        raise BadURL(
            f"ingress URL {shown!r} names no queue: add ?queue=<name>, e.g. "
            "amqp://guest:guest@localhost:5672/?queue=orders",
            url=shown,
            code=_CODE,
        )
    if len(value) > 200 or value.startswith("amq.") or not value.isprintable():
        raise BadURL(
            f"ingress URL {shown!r}: {param}={value[:60]!r} must be printable, at most 200 "
            "characters and not start with 'amq.' (reserved by RabbitMQ)",
            url=shown,
            code=_CODE,
        )
    return value


def _flag(value: str | None, param: str, shown: str) -> bool:
    if value is None or value.lower() in ("0", "false", "no"):
        return False
    if value.lower() in ("1", "true", "yes"):
        return True
    raise BadURL(
        f"ingress URL {shown!r}: {param}={value[:20]!r} must be true or false",
        url=shown,
        code=_CODE,
    )


PLUGIN_HINT: Final = (
    "; partitions= needs RabbitMQ's consistent-hash exchange: enable it with "
    "`rabbitmq-plugins enable rabbitmq_consistent_hash_exchange`"
)


async def bind_partitions(channel: Any, exchange_name: str, queues: list[Any]) -> None:
    """The consistent-hash exchange ``exchange_name`` hashing on ``flowx-tenant``, each
    partition bound with the same weight: a tenant's messages all land in one partition, in
    publish order. The weight is a partition's number of points on the hash ring; the points
    are placed at random, so one point each would split the tenants very unevenly, and
    ``RING_POINTS`` each spreads them close to evenly."""
    exchange = await channel.declare_exchange(
        exchange_name,
        "x-consistent-hash",
        durable=True,
        arguments={"hash-header": TENANT_HEADER},
    )
    for queue in queues:
        await queue.bind(exchange, str(RING_POINTS))


def _partitions(params: Mapping[str, str], shown: str) -> int:
    """``partitions=N`` (0: not partitioned), N from 1 to ``MOST_PARTITIONS``; with
    ``ordered=false`` it is a contradiction (a partition exists to keep order)."""
    value = params.get("partitions")
    if value is None:
        return 0
    if not value.isdigit() or not 1 <= int(value) <= MOST_PARTITIONS:
        raise BadURL(
            f"ingress URL {shown!r}: partitions={value[:20]!r} must be a whole number from 1 to "
            f"{MOST_PARTITIONS}",
            url=shown,
            code=_CODE,
        )
    if params.get("ordered", "true").lower() in ("0", "false", "no"):
        raise BadURL(
            f"ingress URL {shown!r}: partitions= keeps each tenant's messages in order; drop "
            "ordered=false",
            url=shown,
            code=_CODE,
        )
    return int(value)


def _prefetch(value: str | None, shown: str) -> int:
    if value is None:
        return DEFAULT_PREFETCH
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise BadURL(
            f"ingress URL {shown!r}: prefetch={value[:20]!r} must be a whole number from 1 to "
            "65535",
            url=shown,
            code=_CODE,
        )
    return int(value)
