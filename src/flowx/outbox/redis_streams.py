"""Redis Streams: one stream per partition key (R5.4).

The batch goes out as one pipeline (one round trip). Redis runs one connection's commands in
order, so what a dropped connection leaves behind is a prefix; a command that fails on its
own (``WRONGTYPE``: the key is not a stream) is a permanent refusal of that event, and what
follows it in the batch is reported unacknowledged and goes out again (a duplicate where it
was accepted; consumers deduplicate by ``event_id``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from flowx.outbox.publisher import PublishFailure, PublishResult, headers
from flowx.redaction import guard_logs, redact
from flowx.stores.records import EventRecord
from flowx.urls import BadURL

#: Errors a later attempt can clear: memory pressure, a replica or loading server.
_TRANSIENT = ("OOM", "LOADING", "BUSY", "TRYAGAIN", "READONLY", "MASTERDOWN", "CLUSTERDOWN")


class RedisStreamsPublisher:
    """Publish to ``{prefix}{partition_key}``; events with no key go to ``{prefix}_``."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "flowx:events:",
        maxlen: int | None = None,
        timeout: float = 5.0,
    ) -> None:
        from redis import asyncio as aioredis

        self._url = url
        guard_logs("redis", "flowx")  # R9.8: a driver's line never shows the URL's secrets
        self._client: Any = aioredis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self.prefix = prefix
        self._maxlen = maxlen
        self._timeout = timeout

    @property
    def name(self) -> str:
        return "redis-streams"

    def stream(self, partition_key: str | None) -> str:
        """The stream an event goes to: one per partition key, so a consumer group reads
        each key's events in order."""
        return f"{self.prefix}{'_' if partition_key is None else partition_key}"

    async def open(self) -> None:
        """Ask the server once. A server that is down is no error here (events wait in the
        outbox, SPEC §8); one that refuses the URL itself — a database index it does not
        have, wrong credentials — is ``BadURL``: no retry will mend it."""
        from redis import exceptions

        try:
            async with asyncio.timeout(self._timeout):
                await self._client.ping()
        except (exceptions.ResponseError, exceptions.AuthenticationError) as exc:
            raise BadURL(
                f"Redis publisher {redact(self._url)!r} refused the connection: "
                f"{self._shown(exc)}; fix "
                "the URL (database index, credentials)",
                url=redact(self._url),
                code="outbox.bad_publisher_url",
            ) from exc
        except (exceptions.ConnectionError, exceptions.TimeoutError, TimeoutError, OSError):
            return None

    async def close(self) -> None:
        await self._client.aclose()

    def _shown(self, exc: BaseException, how: Any = str) -> str:
        """A driver's message about this connection, without the URL's secrets (R9.8)."""
        return redact(how(exc), secrets_of=(self._url,), limit=None)

    async def publish(self, events: Sequence[EventRecord]) -> PublishResult:
        from redis import exceptions

        if not events:
            return PublishResult(0)
        pipe = self._client.pipeline(transaction=False)
        for e in events:
            fields = headers(e)
            fields["payload"] = e.payload
            pipe.xadd(self.stream(e.partition_key), fields, maxlen=self._maxlen, approximate=True)
        try:
            async with asyncio.timeout(self._timeout):
                replies = await pipe.execute(raise_on_error=False)
        except (exceptions.ConnectionError, exceptions.TimeoutError, TimeoutError, OSError) as exc:
            failure = PublishFailure(f"Redis unavailable: {self._shown(exc, repr)}", False)
            return PublishResult(0, failure)
        except exceptions.ResponseError as exc:  # the connection's own set-up (SELECT, AUTH)
            refusal = f"Redis refused the connection to {redact(self._url)}: {self._shown(exc)}"
            return PublishResult(0, PublishFailure(refusal, False))  # events wait for a fix
        for i, reply in enumerate(replies):
            if isinstance(reply, Exception):
                text = self._shown(reply)
                permanent = not (
                    isinstance(reply, exceptions.ConnectionError | exceptions.TimeoutError)
                    or text.startswith(_TRANSIENT)
                )
                return PublishResult(i, PublishFailure(f"Redis refused: {text}", permanent))
        return PublishResult(len(events))
