"""Per-tenant ordered ingress on RabbitMQ (issue 18): messages/s from a pre-filled queue to
started instances when order per tenant is kept, one ordered queue against partitions.

* ``ordered``: one queue with ``?ordered=true`` (single active consumer, one message at a
  time). However many workers there are, one consumes.
* ``partitions``: ``?partitions=N``, the messages spread by tenant over N partitions, which
  the workers share (``flowx.ingress.partitions``), one message at a time per partition.

Each run fills the queue first (``--tenants`` tenants, round-robin), then starts ``--workers``
hosts in this process on one PostgreSQL journal, each with its ingress consumer, and times
from the first consumer's start to the N-th start committed and acked ("started/s"). The flow
is ``benchmarks.ingress``'s one-step flow.

    python -m benchmarks.ingress_partitions [--messages 2000] [--tenants 64] [--partitions 4]
        [--workers 2]

Writes ``benchmarks/results/ingress-partitions.json`` and prints a table. It asserts nothing
about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import psycopg

import flowx
from benchmarks.ingress import FLOW, PG, RABBITMQ
from flowx import metrics
from flowx.hosting.stores import postgres
from flowx.ingress import IngressDispatcher
from flowx.ingress.rabbitmq import RabbitMQIngress, bind_partitions

RESULTS = Path(__file__).resolve().parent / "results"
SCHEMA = "flowx_bench_ingress_partitions"


async def fill(channel: Any, queue: str, partitions: int, n: int, tenants: int) -> list[str]:
    """Declare the queue (or its partitions and their exchange) and publish ``n`` starts; the
    queue names to delete after."""
    if partitions:
        names = [f"{queue}.p{i}" for i in range(partitions)]
        declared = [await channel.declare_queue(name, durable=True) for name in names]
        await bind_partitions(channel, queue, declared)
        exchange = await channel.get_exchange(queue, ensure=False)
        routing_key = "bench.ingress"
    else:
        names = [queue]
        await channel.declare_queue(
            queue, durable=True, arguments={"x-single-active-consumer": True}
        )
        exchange = channel.default_exchange
        routing_key = queue
    for i in range(n):
        await exchange.publish(
            aio_pika.Message(
                json.dumps({"order_id": f"o-{i}"}).encode(),
                message_id=f"m-{i}",
                headers={"flowx-flow": "bench.ingress", "flowx-tenant": f"t-{i % tenants}"},
            ),
            routing_key=routing_key,
        )
    return names


async def run(mode: str, n: int, tenants: int, partitions: int, workers: int) -> dict[str, Any]:
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')  # type: ignore[arg-type]
    queue = f"flowx_bench_part_{uuid.uuid4().hex[:6]}"
    split = partitions if mode == "partitions" else 0
    connection = await aio_pika.connect(RABBITMQ)
    channel = await connection.channel()
    names = await fill(channel, queue, split, n, tenants)
    param = f"partitions={split}" if split else "ordered=true"
    hosts = [
        flowx.FlowHost(
            store=postgres(PG, schema=SCHEMA),
            flows=[FLOW],
            settings=flowx.HostSettings(recovery=False, retention=False),
        )
        for _ in range(workers)
    ]
    for host in hosts:
        await host.open()
    consumers = [RabbitMQIngress(f"{RABBITMQ}?queue={queue}&{param}") for _ in hosts]
    started0 = metrics.INGRESS_MESSAGES.get("started")
    dead0 = metrics.INGRESS_MESSAGES.get("dead")
    try:
        t0 = time.perf_counter()
        for host, consumer in zip(hosts, consumers, strict=True):
            await consumer.start(IngressDispatcher(host))
        while metrics.INGRESS_MESSAGES.get("started") - started0 < n:
            await asyncio.sleep(0.01)
            if time.perf_counter() - t0 > 600 or metrics.INGRESS_MESSAGES.get("dead") > dead0:
                raise SystemExit("not done within 600 s, or a message was dead-lettered")
        started_s = time.perf_counter() - t0
    finally:
        for consumer in consumers:
            await consumer.stop(timeout=10)
        for host in hosts:
            await host.drain(timeout=10)
        cleanup = await connection.channel()
        for name in [*names, f"{queue}.dead"]:
            await cleanup.queue_delete(name)
        for exchange in ([queue] if split else []) + [f"{queue}.dead"]:
            await cleanup.exchange_delete(exchange)
        await connection.close()
    return {
        "mode": param,
        "workers": workers,
        "tenants": tenants,
        "messages": n,
        "started_s": round(started_s, 2),
        "started_per_s": round(n / started_s),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| mode | workers | tenants | messages | started/s |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['workers']} | {r['tenants']} | {r['messages']:,} "
            f"| {r['started_per_s']:,} |"
        )
    return "\n".join(lines)


async def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--messages", type=int, default=2_000)
    ap.add_argument("--tenants", type=int, default=64)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    rows = [
        await run(mode, args.messages, args.tenants, args.partitions, args.workers)
        for mode in ("ordered", "partitions")
    ]
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "ingress_partitions",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "results": rows,
    }
    (RESULTS / "ingress-partitions.json").write_text(json.dumps(out, indent=2) + "\n")
    print(table(rows))


if __name__ == "__main__":
    asyncio.run(main())
