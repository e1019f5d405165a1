"""Per-tenant order with competing workers on the real RabbitMQ (issue 18 item 1; R6.1):
``?partitions=4`` spreads a queue over four partitions fed by the consistent-hash exchange
(header ``flowx-tenant``). Two workers share the partitions; for every tenant the instances
are started in publish order — read both from a commit ledger and from the journal's
``created_at`` (the hosts run on the real clock) — and when one worker stops mid-stream the
other takes its partitions over where it stopped, the order still held."""

from __future__ import annotations

import asyncio
import random
from typing import Any
from urllib.parse import urlsplit

import pytest

from flowx.clock import SystemClock
from flowx.ingress import Delivery, IngressDispatcher, Started, Verdict
from flowx.ingress.rabbitmq import RabbitMQIngress
from flowx.stores.protocols import InstanceQuery
from flowx.urls import BadURL
from tests.ingress.flows import FLOWS
from tests.ingress.rabbit import RABBITMQ_URL, Partitioned, per_tenant
from tests.support.fault_proxy import FaultProxy
from tests.support.polling import until

TENANTS = [f"tenant-{k}" for k in range(16)]


class Ledger(IngressDispatcher):
    """Appends (worker, key) to a ledger shared by every worker when a start commits: the
    order the instances were started in, across workers. Each message first waits for
    ``gate`` to open, so a test can let a backlog build up behind the messages in hand."""

    def __init__(
        self, host: Any, worker: str, ledger: list[tuple[str, str]], gate: asyncio.Event
    ) -> None:
        super().__init__(host)
        self.worker = worker
        self.ledger = ledger
        self.gate = gate
        self.jitter = random.Random(worker)

    async def handle(self, d: Delivery) -> Verdict:
        await self.gate.wait()
        # Yield a varying number of times, as a real journal's round trips would: were two
        # messages of one partition handled at once, the later could then commit first.
        for _ in range(self.jitter.randrange(8)):
            await asyncio.sleep(0)
        verdict = await super().handle(d)
        if isinstance(verdict, Started) and verdict.created:
            self.ledger.append((self.worker, d.message_id or ""))
        return verdict


def batch(tag: str, per_tenant: int) -> list[tuple[str, str]]:
    """(tenant, key) pairs, the tenants interleaved: t0-0, t1-0, ..., t0-1, t1-1, ..."""
    return [(t, f"{t}.{tag}-{i:02d}") for i in range(per_tenant) for t in TENANTS]


async def test_two_workers_share_the_partitions_and_each_tenant_keeps_its_order(
    partitioned: Partitioned, host_factory: Any
) -> None:
    ledger: list[tuple[str, str]] = []
    gate = asyncio.Event()
    gate.set()
    hosts = [await host_factory(*FLOWS, clock=SystemClock()) for _ in range(2)]
    workers = [RabbitMQIngress(partitioned.url()) for _ in range(2)]
    try:
        await workers[0].start(Ledger(hosts[0], "a", ledger, gate))
        assert workers[0]._claims is not None
        assert len(workers[0]._claims.held) == 4  # alone, it takes every partition
        await workers[1].start(Ledger(hosts[1], "b", ledger, gate))
        claims = [w._claims for w in workers]

        def shared() -> bool:
            held = [c.held if c is not None else [] for c in claims]
            return sorted(len(h) for h in held) == [2, 2] and not set(held[0]) & set(held[1])

        await until(shared, within=20, what="the two workers hold two partitions each")
        # The first batch queues up behind the messages in hand (the gate is shut), then flows.
        first = batch("a", 4)
        gate.clear()
        for tenant, key in first:
            await partitioned.publish(tenant, key)
        gate.set()
        await until(lambda: len(ledger) == len(first), within=60, what="the first batch starts")
        assert {w for w, _ in ledger} == {"a", "b"}, "both workers took some messages"
        # The second batch: worker a stops with messages in hand and a backlog queued; b takes
        # a's partitions over where a stopped.
        second = batch("b", 4)
        gate.clear()
        for tenant, key in second[: len(second) // 2]:
            await partitioned.publish(tenant, key)
        stopping = asyncio.create_task(workers[0].stop(timeout=10))
        gate.set()
        await stopping
        assert claims[1] is not None
        await until(lambda: len(claims[1].held) == 4, within=20, what="b holds every partition")
        for tenant, key in second[len(second) // 2 :]:
            await partitioned.publish(tenant, key)
        total = len(first) + len(second)
        await until(lambda: len(ledger) == total, within=60, what="the second batch starts")
    finally:
        for worker in workers:
            await worker.stop(timeout=10)
    published = per_tenant([key for _, key in first + second])
    assert per_tenant([key for _, key in ledger]) == published
    store = hosts[0].store
    records = await store.catalog.list_instances(InstanceQuery(limit=1000))
    assert len(records) == total
    by_time = sorted(records, key=lambda r: r.created_at)
    assert per_tenant([r.idempotency_key or "" for r in by_time]) == published


async def test_after_the_broker_connection_is_cut_the_worker_claims_its_partitions_again(
    partitioned: Partitioned, host_factory: Any
) -> None:
    """A broker restart (every connection reset, new ones refused, then let through): the
    claims are gone with the connection, and the worker connects and claims them again."""
    target = urlsplit(RABBITMQ_URL)
    async with FaultProxy(target.hostname or "127.0.0.1", target.port or 5672) as proxy:
        via = f"amqp://guest:guest@127.0.0.1:{proxy.port}{target.path or '/'}"
        url = f"{via}?queue={partitioned.name}&partitions={partitioned.n}&reconnect_interval=0.2"
        ledger: list[tuple[str, str]] = []
        gate = asyncio.Event()
        gate.set()
        worker = RabbitMQIngress(url)
        await worker.start(Ledger(await host_factory(*FLOWS), "a", ledger, gate))
        claims = worker._claims
        assert claims is not None and len(claims.held) == partitioned.n
        try:
            await proxy.refuse()
            await until(lambda: not claims.held, within=20, what="the claims go with the link")
            during = batch("during", 1)
            for tenant, key in during:
                await partitioned.publish(tenant, key)
            await proxy.forward()
            await until(lambda: len(claims.held) == partitioned.n, within=20, what="claimed again")
            await until(lambda: len(ledger) == len(during), within=20, what="all started")
        finally:
            await worker.stop(timeout=10)
    assert sorted(key for _, key in ledger) == sorted(key for _, key in during)


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("partitions=0", "from 1 to 256"),
        ("partitions=many", "from 1 to 256"),
        ("partitions=4&ordered=false", "drop ordered=false"),
        ("partitions=4&prefetch=8", "drop prefetch="),
    ],
)
def test_a_bad_partitions_parameter_is_one_clear_line(query: str, says: str) -> None:
    with pytest.raises(BadURL, match=says) as refused:
        RabbitMQIngress(f"amqp://guest:s3cret@localhost:5672/?queue=q&{query}")
    assert "s3cret" not in str(refused.value)


def test_partitions_name_their_queues_after_the_queue() -> None:
    ingress = RabbitMQIngress("amqp://guest:guest@localhost:5672/?queue=orders&partitions=3")
    assert ingress.queues == ["orders.p0", "orders.p1", "orders.p2"]
    assert (ingress.ordered, ingress.prefetch) == (True, 1)
