"""Broker ingress throughput (R6.1): messages/s from a pre-filled queue to started, and to
completed, instances for one worker, beside the same starts made by ``host.start`` directly.

A queue is filled with N start messages for a one-step Durable flow (each with its own message
id, its idempotency key), then one ``FlowHost`` on PostgreSQL consumes it through the ingress
adapter. "started/s" is N over the time from the consumer's start to the N-th start committed
and acked; "completed/s" is N over the time to the N-th instance completed. Both include the
journal's commits: a start, the step, the end.

    python -m benchmarks.ingress [--broker rabbitmq|nats] [--messages 5000] [--prefetch 64]

``--broker nats`` fills a stream of its own (subjects ``<stream>.>``) and consumes it through a
durable pull consumer; ``--prefetch`` is then the most messages one fetch asks for
(``batch=``). Writes ``benchmarks/results/ingress-<broker>.json`` and prints a table. It
asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from pydantic import BaseModel

import flowx
from flowx import metrics
from flowx.hosting.stores import postgres
from flowx.ingress import IngressDispatcher
from flowx.ingress.urls import consumer_from_url

RESULTS = Path(__file__).resolve().parent / "results"
PG = os.environ.get("FLOWX_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
RABBITMQ = os.environ.get("FLOWX_BENCH_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/")
NATS = os.environ.get("FLOWX_BENCH_NATS", "nats://127.0.0.1:4222")
SCHEMA = "flowx_bench_ingress"


class Order(BaseModel):
    order_id: str


@flowx.capability("bench.ingress.confirm", version="1.0.0")
async def confirm(ctx: flowx.StepContext, order: Order) -> str:
    return order.order_id


FLOW = flowx.flow("bench.ingress", version="1", input=Order).step(confirm).build()


async def fill_rabbitmq(queue: str, n: int) -> tuple[str, Callable[[], Awaitable[None]]]:
    """Declare ``queue``, publish ``n`` start messages; the ingress URL and a clean-up."""
    import aio_pika

    connection = await aio_pika.connect(RABBITMQ)
    channel = await connection.channel()
    await channel.declare_queue(queue, durable=True)
    for i in range(n):
        await channel.default_exchange.publish(
            aio_pika.Message(
                json.dumps({"order_id": f"o-{i}"}).encode(),
                message_id=f"m-{i}",
                headers={"flowx-flow": "bench.ingress"},
            ),
            routing_key=queue,
        )

    async def clean() -> None:
        cleanup = await connection.channel()
        await cleanup.queue_delete(queue)
        await cleanup.queue_delete(f"{queue}.dead")
        await cleanup.exchange_delete(f"{queue}.dead")
        await connection.close()

    return queue, clean


async def fill_nats(stream: str, n: int) -> tuple[str, Callable[[], Awaitable[None]]]:
    """Create the stream ``stream`` (subjects ``<stream>.>``), publish ``n`` start messages,
    each with its own ``Nats-Msg-Id``; the stream and a clean-up."""
    import nats

    nc = await nats.connect(NATS)
    js = nc.jetstream()
    await js.add_stream(name=stream, subjects=[f"{stream}.>"])
    for i in range(n):
        await js.publish(
            f"{stream}.bench.ingress",
            json.dumps({"order_id": f"o-{i}"}).encode(),
            headers={"Nats-Msg-Id": f"m-{i}"},
        )

    async def clean() -> None:
        for name in (stream, f"{stream}_DEAD"):
            with contextlib.suppress(Exception):
                await js.delete_stream(name)
        await nc.close()

    return stream, clean


#: Broker -> how to fill a queue of N messages for it.
FEEDERS: dict[str, Callable[[str, int], Awaitable[tuple[str, Callable[[], Awaitable[None]]]]]] = {
    "rabbitmq": fill_rabbitmq,
    "nats": fill_nats,
}


def ingress_url(broker: str, queue: str, prefetch: int) -> str:
    if broker == "rabbitmq":
        return f"{RABBITMQ}?queue={queue}&prefetch={prefetch}"
    if broker == "nats":
        return f"{NATS}/{queue}/bench?batch={prefetch}"
    raise SystemExit(f"--broker {broker}: no feeder yet (add one to FEEDERS once it is merged)")


async def run(broker: str, n: int, prefetch: int) -> dict[str, Any]:
    if broker not in FEEDERS:
        raise SystemExit(f"--broker {broker}: no feeder yet (add one to FEEDERS once merged)")
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')  # type: ignore[arg-type]
    queue = f"flowx_bench_ingress_{uuid.uuid4().hex[:6]}"
    _, clean = await FEEDERS[broker](queue, n)
    host = flowx.FlowHost(
        store=postgres(PG, schema=SCHEMA),
        flows=[FLOW],
        settings=flowx.HostSettings(recovery=False, retention=False),
    )
    await host.open()
    consumer = consumer_from_url(ingress_url(broker, queue, prefetch))
    started0 = metrics.INGRESS_MESSAGES.get("started")
    ended0 = metrics.FLOWS_ENDED.get(("bench.ingress", "completed"))
    dead0 = metrics.INGRESS_MESSAGES.get("dead")
    try:
        t0 = time.perf_counter()
        await consumer.start(IngressDispatcher(host))
        started_s = completed_s = None
        while completed_s is None:
            await asyncio.sleep(0.01)
            now = time.perf_counter() - t0
            if started_s is None and metrics.INGRESS_MESSAGES.get("started") - started0 >= n:
                started_s = now
            if metrics.FLOWS_ENDED.get(("bench.ingress", "completed")) - ended0 >= n:
                completed_s = now
            if now > 600 or metrics.INGRESS_MESSAGES.get("dead") > dead0:
                raise SystemExit("not done within 600 s, or a message was dead-lettered")
        assert started_s is not None
    finally:
        await consumer.stop(timeout=10)
        await host.drain(timeout=10)
        await clean()
    return {
        "broker": broker,
        "store": "postgresql",
        "messages": n,
        "prefetch": prefetch,
        "started_s": round(started_s, 2),
        "started_per_s": round(n / started_s),
        "completed_s": round(completed_s, 2),
        "completed_per_s": round(n / completed_s),
    }


async def direct(n: int, concurrency: int) -> dict[str, Any]:
    """The baseline: the same N keyed starts through ``host.start``, ``concurrency`` at a time,
    with no broker: what the journal alone allows on this machine."""
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')  # type: ignore[arg-type]
    host = flowx.FlowHost(
        store=postgres(PG, schema=SCHEMA),
        flows=[FLOW],
        settings=flowx.HostSettings(recovery=False, retention=False),
    )
    await host.open()
    ended0 = metrics.FLOWS_ENDED.get(("bench.ingress", "completed"))
    todo = iter(range(n))

    async def starter() -> None:
        for i in todo:
            await host.start(FLOW, {"order_id": f"o-{i}"}, idempotency_key=f"m-{i}")

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(starter() for _ in range(concurrency)))
        started_s = time.perf_counter() - t0
        while metrics.FLOWS_ENDED.get(("bench.ingress", "completed")) - ended0 < n:
            await asyncio.sleep(0.01)
        completed_s = time.perf_counter() - t0
    finally:
        await host.drain(timeout=10)
    return {
        "broker": "none (host.start)",
        "store": "postgresql",
        "messages": n,
        "prefetch": concurrency,
        "started_s": round(started_s, 2),
        "started_per_s": round(n / started_s),
        "completed_s": round(completed_s, 2),
        "completed_per_s": round(n / completed_s),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| broker | store | messages | prefetch | started/s | completed/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['broker']} | {r['store']} | {r['messages']:,} | {r['prefetch']} "
            f"| {r['started_per_s']:,} | {r['completed_per_s']:,} |"
        )
    return "\n".join(lines)


async def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--broker", choices=["rabbitmq", "nats"], default="rabbitmq")
    ap.add_argument("--messages", type=int, default=5_000)
    ap.add_argument("--prefetch", type=int, default=64)
    args = ap.parse_args()
    rows = [
        await run(args.broker, args.messages, args.prefetch),
        await direct(args.messages, args.prefetch),
    ]
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "ingress",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "results": rows,
    }
    (RESULTS / f"ingress-{args.broker}.json").write_text(json.dumps(out, indent=2) + "\n")
    print(table(rows))


if __name__ == "__main__":
    asyncio.run(main())
