"""NATS JetStream ingress: a durable pull consumer whose messages start instances or signal
them (R6.1, R9.9).

The URL names the server, the stream and the consumer::

    nats://[user:password@]host:4222/<stream>/<consumer>[?dead_subject=...][&batch=64]...
    tls://host:4222/<stream>/<consumer>?tls_ca=ca.pem&tls_cert=me.pem&tls_key=me.key

Parameters: ``dead_subject`` (below), ``batch`` (the most messages one fetch asks for, 64);
for a consumer the ingress creates, ``ack_wait`` (seconds, 30), ``max_ack_pending`` (1000)
and ``filter`` (a subject, wildcards allowed: the consumer takes only the stream's messages
on it).

Order: ``max_ack_pending=1`` makes the consumer hand out one message at a time, in stream
order, across every worker sharing it — a message being retried (nak'ed) holds back the next
one, a dead one does not. With ``filter=`` one such consumer per partition of the subjects
(``orders.p0.>``, ``orders.p1.>``, ...) keeps each partition in order and runs partitions in
parallel.

The stream must exist (operators own streams; the ingress never creates one it reads). The
consumer is created if absent: durable, pull, explicit ack, unlimited redeliveries (a message
must never be dropped because *our* side was down too often) and ``max_ack_pending`` bounding
what the workers together hold unacked. Every worker naming the same consumer shares it:
competing consumers, each message to one of them. TLS: as the outbox's NATS publisher
(``tls_ca``, ``tls_cert``, ``tls_key``; ``flowx.outbox.nats_jetstream.tls_context``).

Each message becomes a ``Delivery``: its subject, its headers (names lower-cased, as the
message contract spells them), and its id — the publisher's ``Nats-Msg-Id`` when it set one,
else ``nats:<stream>:<stream created>:<stream sequence>``. The stream sequence is stable
across redeliveries (a consumer sequence is not), and the stream's creation time keeps a
stream deleted and created again from reusing an earlier stream's keys. Then, by verdict:

* ``Started``/``Signalled``: the start or signal is committed, so the message is acked, with
  a double ack (``ack_sync``: the server confirms it) — a lost ack only means a redelivery,
  which the idempotency key makes inert.
* ``Dead``: the message is published to ``<dead_subject>.<subject>`` (default
  ``dead_subject``: ``flowx.dead.<stream>``) with the headers ``flowx-dead-code`` and
  ``flowx-dead-reason``, its own headers and body, and the publish ack is awaited; only then
  is the original terminated (``term``: never redelivered). If no stream captures the dead
  subject, one named ``<stream>_DEAD`` is created for it; a dead subject the ingress stream
  itself captures is refused (the dead letter would come back as work). If the dead-letter
  publish fails, the original is nak'ed with a delay and tried again later.
* ``IngressRetry`` (our side is down) or any other error: ``nak`` with a backoff that grows
  with the number of deliveries (``retry_delay`` doubled per delivery, at most
  ``MAX_RETRY_DELAY``); never ``term``.

While a message is handled, ``in_progress`` is sent every third of the consumer's AckWait, so
a slow start is not redelivered to another worker meanwhile. Backpressure: a fetch asks for at
most the host's free flow slots (less the messages being handled); with no free slot nothing
is fetched.

Connection: once connected, nats-py reconnects for ever (a broker restart does not end the
ingress). At ``start``, a server that does not answer is retried in the background, since a
broker may come up after its workers; one that refuses us (login, TLS) or a stream, consumer
or dead-letter stream that cannot be used raises ``NatsIngressUnavailable`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
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
from flowx.ingress.nats_url import CODE, NatsTarget, covers, parse_url
from flowx.outbox.nats_jetstream import tls_context
from flowx.redaction import guard_logs, redact
from flowx.urls import BadURL

log = logging.getLogger("flowx.ingress.nats")

__all__ = ["NatsIngressUnavailable", "NatsJetStreamIngress", "NatsTarget", "parse_url"]

#: Set on a dead letter whose body was left out: it fitted the server only without our headers.
DEAD_BODY_DROPPED_HEADER: Final = "flowx-dead-body-dropped"
#: The longest nak delay, whatever the number of deliveries.
MAX_RETRY_DELAY: Final = 60.0
#: How often (seconds) an idle worker checks that its consumer still exists.
IDLE_CHECK: Final = 30.0
#: How often a worker with no free slot looks again (in-flight instances end without a signal
#: this module could wait on).
_ROOM_POLL: Final = 0.05


class NatsIngressUnavailable(FlowXError):
    """The server refused us (``ingress.refused``: the login, TLS), or the stream, the
    consumer or the dead-letter stream cannot be used as the URL asks; the message says which
    and what to do."""

    code = "ingress.unavailable"


class _NotReached(NatsIngressUnavailable):
    """No server answered: at start-up, retried in the background (the broker may come up
    after the worker)."""


class NatsJetStreamIngress:
    """Consumes one durable pull consumer into a dispatcher, from ``start`` until ``stop``
    (a ``flowx.ingress.urls.IngressConsumer``).

    ``fetch_wait``: how long an idle fetch waits for messages (and so how long ``stop`` may
    wait for the fetch in flight); ``retry_delay``: the first nak delay after
    ``IngressRetry``; ``timeout``: for connecting and each JetStream request. The consumer's
    own settings come from the URL.
    """

    def __init__(
        self,
        url: str,
        *,
        fetch_wait: float = 1.0,
        retry_delay: float = 1.0,
        timeout: float = 5.0,
    ) -> None:
        if min(fetch_wait, retry_delay, timeout) <= 0:
            raise ValueError("fetch_wait, retry_delay and timeout must be positive")
        self.target = parse_url(url)
        if self.target.wants_tls:  # a missing or unreadable file is refused now
            try:
                tls_context(self.target.shown, self.target.tls_files)
            except BadURL as exc:
                raise BadURL(exc.message, url=exc.url, code=CODE) from exc
        self._fetch_wait = fetch_wait
        self._retry_delay = retry_delay
        self._timeout = timeout
        self._nc: Any = None
        self._js: Any = None
        self._sub: Any = None
        self._epoch = ""  # the stream's creation time, part of a sequence-based message id
        self._dead_stream = ""
        self._keepalive_every = self.target.ack_wait / 3
        self._handling: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._consuming: asyncio.Task[None] | None = None
        self._next_check = 0.0  # the loop's clock: when an idle worker next checks its consumer

    @property
    def name(self) -> str:
        return f"nats stream {self.target.stream!r} consumer {self.target.consumer!r}"

    @property
    def connected(self) -> bool:
        """Connected to the server now (while it reconnects after a broker restart: not)."""
        return self._nc is not None and bool(self._nc.is_connected)

    # -- opening ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect, check the stream, create the consumer and the dead-letter stream if
        absent, and bind the pull subscription; ``NatsIngressUnavailable`` saying what is
        missing (the server unreachable or refusing us, no such stream, a push consumer)."""
        if self._sub is not None:
            return
        try:
            await self._connect()
            await self._prepare()
        except BaseException as exc:
            await self.close()
            if isinstance(exc, Exception) and not isinstance(exc, FlowXError):
                raise NatsIngressUnavailable(
                    f"NATS JetStream at {self.target.shown!r} cannot be used: {self._said(exc)}"
                ) from exc
            raise

    def _said(self, exc: BaseException) -> str:
        return redact(repr(exc), secrets_of=(self.target.server,))

    async def _connect(self) -> None:
        from nats.aio.client import Client

        guard_logs("nats", "flowx")  # R9.8: a driver's line never shows the URL's secrets
        target = self.target
        tls = tls_context(target.shown, target.tls_files) if target.wants_tls else None
        first_error: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()

        async def noted(exc: Exception) -> None:
            if not first_error.done():
                first_error.set_result(exc)

        # Reconnect for ever once connected (a broker restart must not end the ingress). The
        # first connect would be retried for ever too: its first error ends it instead.
        nc: Any = Client()  # typed loosely: its stubs want ints where floats work
        self._nc = nc
        connecting = asyncio.ensure_future(
            nc.connect(
                target.server,
                connect_timeout=max(1, round(self._timeout)),
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                error_cb=noted,
                **({"tls": tls} if tls is not None else {}),
            )
        )
        done, _ = await asyncio.wait(
            {connecting, first_error}, timeout=self._timeout, return_when="FIRST_COMPLETED"
        )
        failed = connecting.exception() if connecting in done else None
        if connecting not in done or failed is not None:
            if connecting not in done:
                connecting.cancel()
                with contextlib.suppress(BaseException):
                    await connecting
            why: BaseException = (
                first_error.result()
                if first_error.done()
                else failed or TimeoutError(f"no answer within {self._timeout:g}s")
            )
            if _refusal(why):
                raise NatsIngressUnavailable(
                    f"NATS at {target.shown!r} refused the connection: {self._said(why)}; "
                    "check the URL's user, password and TLS files",
                    code="ingress.refused",
                ) from why
            raise _NotReached(
                f"NATS at {target.shown!r} cannot be reached: {self._said(why)}"
            ) from why
        if tls is not None and not nc._server_info.get("tls_required"):
            raise NatsIngressUnavailable(
                f"NATS at {target.shown!r} does not require TLS, which the URL asks for",
                code="ingress.refused",
            )
        self._js = nc.jetstream(timeout=self._timeout)

    async def _prepare(self) -> None:
        from nats.js import api
        from nats.js.errors import NotFoundError

        target, jsm = self.target, self._js._jsm
        try:
            info = await jsm.stream_info(target.stream)
        except NotFoundError as exc:
            raise NatsIngressUnavailable(
                f"NATS stream {target.stream!r} does not exist: create it with the subjects "
                f"the ingress reads (e.g. nats stream add {target.stream} --subjects 'orders.>')"
            ) from exc
        created = info.created
        self._epoch = str(int(created.timestamp() * 1_000_000)) if created else "0"
        try:
            consumer = await jsm.consumer_info(target.stream, target.consumer)
        except NotFoundError:
            consumer = await jsm.add_consumer(
                target.stream,
                api.ConsumerConfig(
                    durable_name=target.consumer,
                    ack_policy=api.AckPolicy.EXPLICIT,
                    ack_wait=self.target.ack_wait,
                    max_deliver=-1,
                    max_ack_pending=self.target.max_ack_pending,
                    filter_subject=self.target.subject_filter,
                ),
            )
        config = consumer.config
        if config.deliver_subject or config.ack_policy != api.AckPolicy.EXPLICIT:
            raise NatsIngressUnavailable(
                f"NATS consumer {target.consumer!r} on {target.stream!r} must be a pull "
                "consumer with explicit acks; name another consumer (the ingress creates it)"
            )
        wanted = target.subject_filter
        if wanted is not None and (config.filter_subject or None) != wanted:
            raise NatsIngressUnavailable(
                f"NATS consumer {target.consumer!r} on {target.stream!r} takes "
                f"{config.filter_subject or 'every subject'!r}, not the URL's filter {wanted!r}: "
                "name another consumer (the ingress creates it)"
            )
        if config.ack_wait:
            self._keepalive_every = max(0.1, config.ack_wait / 3)
        if config.max_deliver not in (None, -1, 0):
            log.warning(
                "NATS consumer %r on %r stops redelivering after %d deliveries: a message our "
                "side could not take that often is dropped, not dead-lettered; use a consumer "
                "with unlimited deliveries (the ingress creates one so)",
                target.consumer,
                target.stream,
                config.max_deliver,
            )
        self._dead_stream = await self._dead_letter_stream(info.config.subjects or [])
        self._sub = await self._js.pull_subscribe_bind(
            durable=target.consumer, stream=target.stream
        )

    async def _dead_letter_stream(self, own_subjects: list[str]) -> str:
        """The stream that captures ``<dead_prefix>.>``: an existing one, or ``<stream>_DEAD``
        created now. Two workers creating it at once both succeed (same configuration)."""
        from nats.js import api
        from nats.js.errors import NotFoundError

        target, jsm = self.target, self._js._jsm
        wanted = f"{target.dead_prefix}.>"
        try:
            found: str = await jsm.find_stream_name_by_subject(wanted)
        except NotFoundError:
            found = ""
        if found == target.stream or any(covers(s, wanted) for s in own_subjects):
            raise NatsIngressUnavailable(
                f"NATS stream {target.stream!r} captures the dead-letter subject "
                f"{wanted!r}: dead letters would come back as work; set dead_subject= to a "
                "subject outside the stream"
            )
        if found:
            return found
        name = f"{target.stream}_DEAD"
        try:
            await jsm.add_stream(api.StreamConfig(name=name, subjects=[wanted]))
        except Exception as exc:
            raise NatsIngressUnavailable(
                f"the dead-letter stream {name!r} for {wanted!r} cannot be created: "
                f"{redact(str(exc))}; create a stream capturing it, or set dead_subject="
            ) from exc
        return name

    # -- consuming -------------------------------------------------------------------------

    async def start(self, dispatcher: IngressDispatcher) -> None:
        """Open, then consume in the background until ``stop``. A server that refuses us, or
        a stream, consumer or dead-letter stream that cannot be used, raises
        ``NatsIngressUnavailable``; a server that does not answer is retried in the
        background (with a backoff to ``MAX_RETRY_DELAY``), as the broker may start later."""
        self._stopping.clear()
        try:
            await self.open()
        except _NotReached as exc:
            log.warning("%s: %s; retrying in the background", self.name, exc.message)
            work = self._open_then_consume(dispatcher)
        else:
            work = self._consume(dispatcher)
        self._consuming = asyncio.create_task(work)
        self._consuming.add_done_callback(self._ended)

    async def _open_then_consume(self, dispatcher: IngressDispatcher) -> None:
        delay = self._retry_delay
        while True:
            await self._wait_stopping(delay)
            if self._stopping.is_set():
                return
            try:
                await self.open()
            except NatsIngressUnavailable as exc:  # the stream may be created meanwhile too
                delay = min(delay * 2, MAX_RETRY_DELAY)
                log.warning("%s: still not consuming: %s", self.name, exc.message)
            else:
                log.info("%s: connected, consuming", self.name)
                break
        await self._consume(dispatcher)

    async def _consume(self, dispatcher: IngressDispatcher) -> None:
        try:
            while not self._stopping.is_set():
                room = min(self.target.batch, dispatcher.free_slots() - len(self._handling))
                if room <= 0:  # backpressure: no free slot, no fetch
                    await self._wait_stopping(_ROOM_POLL)
                    continue
                for msg in await self._fetch(room):
                    task = asyncio.create_task(self._settle(dispatcher, msg))
                    self._handling.add(task)
                    task.add_done_callback(self._settled)
            if self._handling:  # stopping: let the messages in hand settle
                await asyncio.wait(set(self._handling))
        except asyncio.CancelledError:
            for task in self._handling:  # unacked: the server redelivers them
                task.cancel()
            raise

    def _settled(self, task: asyncio.Task[None]) -> None:
        """A message's task ended: forget it; a bug in settling it is logged (its message,
        unacked, comes back after AckWait)."""
        self._handling.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("NATS ingress %s: settling a message failed: %r", self.name, task.exception())

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("NATS ingress %s stopped consuming: %r", self.target.shown, task.exception())

    async def _fetch(self, room: int) -> list[Any]:
        from nats.errors import TimeoutError as NatsTimeout

        try:
            msgs: list[Any] = await self._sub.fetch(room, timeout=self._fetch_wait)
        except (NatsTimeout, TimeoutError):
            await self._check_idle()
            return []  # nothing to take
        except Exception as exc:  # disconnected, the consumer deleted, ...: try again soon
            log.warning(
                "NATS ingress %s: fetch failed, trying again: %s",
                self.target.shown,
                redact(repr(exc), secrets_of=(self.target.server,)),
            )
            await self._wait_stopping(self._retry_delay)
            return []
        return msgs

    async def _check_idle(self) -> None:
        """Now and then while idle, make sure the consumer still exists: a fetch from a
        deleted one just comes back empty. It is not created again (a new consumer would
        read the stream from its start); the error says what to do."""
        from nats.js.errors import NotFoundError

        now = asyncio.get_running_loop().time()
        if now < self._next_check:
            return
        self._next_check = now + IDLE_CHECK
        try:
            await self._js._jsm.consumer_info(self.target.stream, self.target.consumer)
        except NotFoundError:
            log.error(
                "NATS ingress %s: consumer %r on stream %r is gone; this worker takes nothing "
                "from it until it exists (a restart creates it, reading the stream from its "
                "start)",
                self.target.shown,
                self.target.consumer,
                self.target.stream,
            )
        except Exception:  # disconnected: the next fetch says so
            return

    async def _wait_stopping(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    def delivery(self, msg: Any) -> Delivery:
        """What the dispatcher sees of ``msg`` (see the module docstring for its id)."""
        meta = msg.metadata
        headers = {str(k).lower(): str(v) for k, v in (msg.headers or {}).items()}
        message_id = headers.get("nats-msg-id") or (
            f"nats:{self.target.stream}:{self._epoch}:{meta.sequence.stream}"
        )
        return Delivery(
            body=msg.data,
            message_id=message_id,
            headers=headers,
            subject=msg.subject,
            redelivered=meta.num_delivered > 1,
        )

    async def _settle(self, dispatcher: IngressDispatcher, msg: Any) -> None:
        """Handle one message and ack, dead-letter or nak it by the verdict."""
        try:
            delivery = self.delivery(msg)
        except Exception as exc:  # not a JetStream message: nothing can ack it
            log.warning("NATS ingress %s: unusable message: %r", self.target.shown, exc)
            return
        keepalive = asyncio.create_task(self._keep_alive(msg))
        try:
            verdict = await dispatcher.handle(delivery)
        except Exception as exc:
            if not isinstance(exc, IngressRetry):
                log.exception("NATS ingress %s: handling a message failed", self.target.shown)
            await self._nak(msg, delivery, exc)
            return
        finally:
            keepalive.cancel()
        if isinstance(verdict, Dead):
            await self._dead_letter(msg, delivery, verdict)
            return
        try:
            await msg.ack_sync(timeout=self._timeout)
        except Exception as exc:  # not confirmed: a redelivery finds the recorded start
            log.info("NATS ingress %s: ack not confirmed: %r", self.target.shown, exc)

    async def _keep_alive(self, msg: Any) -> None:
        """``in_progress`` every third of AckWait: a slow handle keeps its message."""
        while True:
            await asyncio.sleep(self._keepalive_every)
            with contextlib.suppress(Exception):
                await msg.in_progress()

    async def _nak(self, msg: Any, delivery: Delivery, why: BaseException) -> None:
        """Our side failed: redeliver later, after a delay that grows with each delivery."""
        deliveries = msg.metadata.num_delivered
        delay = min(MAX_RETRY_DELAY, self._retry_delay * 2 ** min(deliveries - 1, 16))
        log.warning(
            "NATS ingress %s: message %s left for a redelivery in %.1fs: %s",
            self.target.shown,
            redact(delivery.message_id or "-"),
            delay,
            redact(str(why)),
        )
        with contextlib.suppress(Exception):  # unsent: AckWait redelivers it anyway
            await msg.nak(delay=delay)

    async def _dead_letter(self, msg: Any, delivery: Delivery, dead: Dead) -> None:
        """Publish the dead letter, wait for its ack, then terminate the original."""
        seq = msg.metadata.sequence.stream
        headers = {
            k: v for k, v in (msg.headers or {}).items() if not k.lower().startswith("nats-")
        }
        headers[DEAD_CODE_HEADER] = dead.code
        headers[DEAD_REASON_HEADER] = dead.reason
        headers["flowx-dead-subject"] = msg.subject
        headers["flowx-dead-message-id"] = delivery.message_id or ""
        # Published again after a crash before the term, it is deduplicated by the stream.
        headers["Nats-Msg-Id"] = f"flowx-dead:{self.target.stream}:{self._epoch}:{seq}"
        subject = f"{self.target.dead_prefix}.{msg.subject}"
        body: bytes = msg.data
        # The server refuses (and disconnects) a message over its payload limit, headers
        # included: a body that fits only without our headers goes without its body, or the
        # message would be nak'ed for ever.
        if len(body) + _header_bytes(headers) > self._nc.max_payload:
            headers[DEAD_BODY_DROPPED_HEADER] = (
                f"{len(body)} bytes, over the server's payload limit with the dead-letter headers"
            )
            body = b""
        try:
            await self._js.publish(
                subject, body, timeout=self._timeout, stream=self._dead_stream, headers=headers
            )
        except Exception as exc:
            await self._nak(msg, delivery, RuntimeError(f"dead-letter publish failed: {exc!r}"))
            return
        with contextlib.suppress(Exception):  # unsent: redelivered, dead again, deduplicated
            await msg.term()

    # -- stopping --------------------------------------------------------------------------

    async def stop(self, timeout: float = 30.0) -> None:
        """Stop fetching, let the messages being handled settle within ``timeout`` seconds
        (past it they are cut off, unacked, and redelivered elsewhere), then close. Safe to
        call more than once, and before ``start``."""
        self._stopping.set()
        task, self._consuming = self._consuming, None
        if task is not None:
            _done, pending = await asyncio.wait({task}, timeout=timeout)
            if pending:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.close()

    async def close(self) -> None:
        """Drop the connection; unacked messages are redelivered by the server."""
        nc, self._nc, self._js, self._sub = self._nc, None, None, None
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(Exception):
                await nc.close()


def _refusal(exc: BaseException) -> bool:
    """An answer from the server that no retry changes: the login refused, TLS failed or
    not spoken as asked."""
    from nats import errors

    refused = (
        errors.AuthorizationError,
        errors.SecureConnRequiredError,
        errors.SecureConnWantedError,
        errors.SecureConnFailedError,
        ssl.SSLError,
    )
    if isinstance(exc, refused):
        return True
    return "authorization violation" in str(exc).lower()


def _header_bytes(headers: dict[str, str]) -> int:
    """What ``headers`` add to a message on the wire (``NATS/1.0`` and one line each), with a
    margin for the stream's expected-stream header."""
    lines = sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())
    return len(b"NATS/1.0\r\n\r\n") + lines + 128
