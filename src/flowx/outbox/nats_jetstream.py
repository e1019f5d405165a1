"""NATS JetStream: a subject per event type under one prefix (R5.4).

The batch is written in order without waiting, each message with its own reply subject, and
the publish acks are collected together (one round trip for the batch). (nats-py's own
``publish_async`` is not used: in 2.16 a refusal never resolves its future, so it looks like
a timeout.) The acknowledged prefix is the run of acks from the start of
the batch up to the first that is missing or an error; what follows goes out again. Every
message carries ``Nats-Msg-Id: event_id``, so a stream deduplicates a batch sent again within
its duplicate window; outside it consumers deduplicate by ``event_id``.

A stream at its message limit with ``discard: new`` (error 10077) refuses for now: transient,
as are a timeout and a lost connection. No stream for the subject and a message over the
server's payload limit are permanent. The publisher never creates streams: operators do.

TLS: nats-py takes an ``ssl.SSLContext``, not file names, so the URL carries FlowX's own
``tls_ca=``, ``tls_cert=`` and ``tls_key=`` (PEM files), taken off before nats-py sees the URL.
With any of them, or the ``tls://`` scheme, the context verifies the server's certificate and
host name (against ``tls_ca``, else the system's CAs) and presents the client certificate; a
server that does not then require TLS is refused rather than spoken to in clear.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import Sequence
from typing import Any

from flowx.outbox.publisher import PublishFailure, PublishResult, headers
from flowx.redaction import guard_logs, redact
from flowx.stores.records import EventRecord
from flowx.urls import BadURL, take_params

#: FlowX's own query parameters of a NATS URL: PEM files for the TLS context.
TLS_PARAMS = ("tls_ca", "tls_cert", "tls_key")

#: JetStream error codes a later attempt can clear: the stream is at ``max_msgs`` with
#: ``discard: new``. Any 5xx (the server reports 503 for that too, or no leader) is transient.
_TRANSIENT_ERR_CODES = frozenset({10077})


class NatsJetStreamPublisher:
    """Publish each event to ``{subject_prefix}.{event.type}``."""

    def __init__(
        self, url: str, *, subject_prefix: str = "flowx.events", timeout: float = 5.0
    ) -> None:
        self.url, self._tls_files = take_params(url, lambda key: key in TLS_PARAMS)
        self._wants_tls = bool(self._tls_files) or self.url.startswith("tls://")
        if self._wants_tls:
            tls_context(url, self._tls_files)  # a missing or bad file is refused now
        self.subject_prefix = subject_prefix
        self._timeout = timeout
        self._nc: Any = None

    @property
    def name(self) -> str:
        return "nats-jetstream"

    def subject(self, event: EventRecord) -> str:
        """The subject an event goes to: the prefix, then the event type, so consumers
        subscribe per type."""
        return f"{self.subject_prefix}.{event.type}"

    async def open(self) -> None:
        async with asyncio.timeout(self._timeout):
            await self._ensure_open()

    async def _ensure_open(self) -> Any:
        import nats

        if self._nc is None or self._nc.is_closed:
            await self._drop()
            guard_logs("nats", "flowx")  # R9.8: a driver's line never shows the URL's secrets

            async def quiet(_exc: Exception) -> None:
                return None

            # No background reconnecting: a closed client is replaced on the next publish.
            # ``max_reconnect_attempts=0`` would make the first connect retry a dead server
            # forever; 1 gives up after a second refused attempt.
            # The context is built at each connect, so renewed certificate files are read.
            tls = tls_context(self.url, self._tls_files) if self._wants_tls else None
            self._nc = await nats.connect(
                self.url,
                connect_timeout=max(1, round(self._timeout)),
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.1,
                error_cb=quiet,
                **({"tls": tls} if tls is not None else {}),
            )
            # nats-py upgrades to TLS only when the server's INFO asks for it; asked for TLS
            # and not given it, the connection is not used.
            if tls is not None and not self._nc._server_info.get("tls_required"):
                await self._drop()
                raise ConnectionError(
                    f"NATS at {redact(self.url)} does not require TLS, which the URL asks for"
                )
        return self._nc

    async def _drop(self) -> None:
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(Exception):
                await nc.close()

    async def close(self) -> None:
        await self._drop()

    async def publish(self, events: Sequence[EventRecord]) -> PublishResult:
        if not events:
            return PublishResult(0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        acks: list[asyncio.Future[None]] = [loop.create_future() for _ in events]
        sent = 0
        send_failure: PublishFailure | None = None
        sub: Any = None
        try:
            async with asyncio.timeout_at(deadline):
                nc = await self._ensure_open()
                inbox = nc.new_inbox()

                async def on_reply(msg: Any) -> None:
                    _settle(acks[int(msg.subject.rsplit(".", 1)[1])], msg)

                sub = await nc.subscribe(f"{inbox}.*", cb=on_reply)
                for i, e in enumerate(events):
                    hdrs = headers(e)
                    hdrs["Nats-Msg-Id"] = e.event_id
                    await nc.publish(
                        self.subject(e), e.payload.encode(), reply=f"{inbox}.{i}", headers=hdrs
                    )
                    sent += 1
                await nc.flush()
        except Exception as exc:
            # What went out before the failure may still be acknowledged below.
            send_failure = _failure(exc, self.url)
        if sent:
            await asyncio.wait(acks[:sent], timeout=max(0.0, deadline - loop.time()))
        result = PublishResult(sent, send_failure) if send_failure else PublishResult(sent)
        for i, ack in enumerate(acks[:sent]):
            if not ack.done():
                reason = f"NATS JetStream did not acknowledge within {self._timeout}s"
                result = PublishResult(i, PublishFailure(reason, False))
                break
            error = ack.exception()
            if error is not None:
                result = PublishResult(i, _failure(error, self.url))
                break
        for ack in acks:
            if ack.done():
                ack.exception()
            else:
                ack.cancel()
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if self._nc is not None and not self._nc.is_connected:
            await self._drop()
        return result


def tls_context(url: str, files: dict[str, str]) -> ssl.SSLContext:
    """The context ``tls_ca``/``tls_cert``/``tls_key`` name: verifying the server (against
    ``tls_ca``, else the system's CAs) and presenting the client certificate; ``BadURL`` when
    a file cannot be read or the certificate and key do not match."""
    if ("tls_cert" in files) != ("tls_key" in files):
        raise BadURL(
            f"NATS URL {redact(url)!r}: tls_cert and tls_key go together (the client "
            "certificate and its private key)",
            url=redact(url),
            code="outbox.bad_publisher_url",
        )
    try:
        context = ssl.create_default_context(cafile=files.get("tls_ca"))
        if "tls_cert" in files:
            context.load_cert_chain(files["tls_cert"], files["tls_key"])
    except (OSError, ssl.SSLError) as exc:
        raise BadURL(
            f"NATS URL {redact(url)!r}: the TLS files cannot be used ({exc}); check tls_ca, "
            "tls_cert and tls_key",
            url=redact(url),
            code="outbox.bad_publisher_url",
        ) from exc
    return context


def _settle(ack: asyncio.Future[None], msg: Any) -> None:
    """Resolve ``ack`` from a JetStream publish reply (a PubAck, an error, or no responders)."""
    from nats.js import errors as js_errors

    if ack.done():
        return
    if msg.headers and msg.headers.get("Status") == "503":
        ack.set_exception(js_errors.NoStreamResponseError())
        return
    try:
        reply = json.loads(msg.data)
        if "error" in reply:
            js_errors.APIError.from_error(reply["error"])  # raises the typed error
        ack.set_result(None)
    except Exception as exc:
        ack.set_exception(exc)


def _failure(exc: BaseException, url: str) -> PublishFailure:
    """Why a batch was not acknowledged; a driver's text never carries the URL's secrets (a
    reason is stored with the event and shown by ``flowx outbox``)."""
    from nats import errors
    from nats.js import errors as js_errors

    if isinstance(exc, js_errors.NoStreamResponseError):
        return PublishFailure("NATS JetStream: no stream covers the subject", True)
    if isinstance(exc, errors.MaxPayloadError):
        return PublishFailure("NATS: the message is over the server's payload limit", True)
    if isinstance(exc, js_errors.APIError):
        transient = exc.err_code in _TRANSIENT_ERR_CODES or (exc.code or 0) >= 500
        text = redact(str(exc), secrets_of=(url,), limit=None)
        return PublishFailure(f"NATS JetStream refused: {text}", not transient)
    return PublishFailure(
        f"NATS unavailable: {redact(repr(exc), secrets_of=(url,), limit=None)}", False
    )
