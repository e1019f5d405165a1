"""The NATS ingress tests' own JetStream: a stream per test (``own_stream``), a dispatcher
that records its verdicts (and can hold each handle at a gate), and a consuming ingress."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import pytest

import flowx
from flowx.ingress import Delivery, IngressDispatcher, Started
from flowx.ingress.nats_jetstream import NatsJetStreamIngress
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceState

NATS = os.environ.get("FLOWX_TEST_NATS_URL", "nats://127.0.0.1:4222")


@dataclass
class Stream:
    """A stream of the test's own, capturing ``<prefix>.>``."""

    nc: Any
    name: str
    prefix: str

    def url(self, consumer: str = "workers", query: str = "") -> str:
        return f"{NATS}/{self.name}/{consumer}{'?' + query if query else ''}"

    async def publish(self, body: bytes, flow: str = "ing.order", **headers: str) -> Any:
        js = self.nc.jetstream()
        return await js.publish(f"{self.prefix}.{flow}", body, headers=headers or None)

    async def consumer(self, name: str = "workers") -> Any:
        return await self.nc.jetstream()._jsm.consumer_info(self.name, name)

    async def drained(self, name: str = "workers") -> bool:
        """Every message taken and settled (acked or terminated): none pending, none out."""
        info = await self.consumer(name)
        return bool(info.num_pending == 0 and info.num_ack_pending == 0)

    async def dead_letters(self) -> list[Any]:
        jsm = self.nc.jetstream()._jsm
        info = await jsm.stream_info(f"{self.name}_DEAD")
        return [
            await jsm.get_msg(info.config.name, seq) for seq in range(1, info.state.last_seq + 1)
        ]

    async def dead_count(self) -> int:
        try:
            info = await self.nc.jetstream()._jsm.stream_info(f"{self.name}_DEAD")
        except Exception:
            return 0
        return int(info.state.messages)


class Recording(IngressDispatcher):
    """The verdicts it gave, in order; ``gate`` (when set up) holds each handle until opened."""

    def __init__(self, host: flowx.FlowHost, **kw: Any) -> None:
        super().__init__(host, **kw)
        self.verdicts: list[tuple[Delivery, Any]] = []
        self.gate: asyncio.Event | None = None
        self.holding = 0

    async def handle(self, d: Delivery) -> Any:
        if self.gate is not None:
            self.holding += 1
            await self.gate.wait()
            self.holding -= 1
        verdict = await super().handle(d)
        self.verdicts.append((d, verdict))
        return verdict

    def started(self) -> list[Started]:
        return [v for _, v in self.verdicts if isinstance(v, Started)]


@asynccontextmanager
async def consuming(url: str, dispatcher: IngressDispatcher, **kw: Any) -> AsyncIterator[Any]:
    ingress = NatsJetStreamIngress(url, **{"retry_delay": 0.1, **kw})
    await ingress.start(dispatcher)
    try:
        yield ingress
    finally:
        await ingress.stop(timeout=10)


async def instances(host: flowx.FlowHost) -> list[Any]:
    assert host.store is not None
    return list(await host.store.catalog.list_instances(InstanceQuery(limit=500)))


async def completed(host: flowx.FlowHost, n: int) -> bool:
    found = await instances(host)
    return len(found) == n and all(r.state is InstanceState.COMPLETED for r in found)


def order(order_id: str, **kw: Any) -> bytes:
    return json.dumps({"order_id": order_id, **kw}).encode()


@asynccontextmanager
async def own_stream() -> AsyncIterator[Stream]:
    """A stream capturing ``<prefix>.>``, deleted after (with its ``_DEAD`` stream); the test
    is skipped when no NATS runs."""
    import nats
    from nats.js import api

    try:
        nc = await nats.connect(NATS, connect_timeout=2, allow_reconnect=False)
    except Exception as exc:
        pytest.skip(f"NATS is not running at {NATS}: {exc!r}")
    tag = uuid.uuid4().hex[:10]
    made = Stream(nc, f"FXT_{tag}", f"fxt_{tag}")
    # A work queue, as the README advises; a short duplicate window, so a test can store the
    # same Nats-Msg-Id twice.
    config = api.StreamConfig(
        name=made.name,
        subjects=[f"{made.prefix}.>"],
        retention=api.RetentionPolicy.WORK_QUEUE,
        duplicate_window=0.2,
    )
    await nc.jetstream()._jsm.add_stream(config)
    try:
        yield made
    finally:
        for name in (made.name, f"{made.name}_DEAD"):
            with suppress(Exception):
                await nc.jetstream()._jsm.delete_stream(name)
        await nc.close()
