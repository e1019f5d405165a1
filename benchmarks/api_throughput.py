"""The HTTP API's cost: starts and signals through ``POST /v1/...`` against the same calls on
the host in-process, side by side.

    python -m benchmarks.api_throughput                          # PostgreSQL (the test server)
    python -m benchmarks.api_throughput --db sqlite:///.bench/api.db --rounds 4

One process: a host on the journal, uvicorn serving the API on a loopback socket, and an
httpx client at ``--concurrency`` requests in flight. Rounds alternate API and in-process
(interleaved, so the machine's noise lands on both), each round ``--count`` starts (left
``Pending``, as ``flowx serve`` leaves them: the start is what is measured, not the run) and
as many signals (kept in the inbox of those instances). Client and server share the process
and its two cores, as a sidecar client on the same machine would: the ratio is the price of
HTTP, JSON and validation per request, not of the network. Writes
``benchmarks/results/api_throughput-<backend>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from pydantic import BaseModel

import flowx
from flowx.api import create_app

RESULTS = Path(__file__).resolve().parent / "results"
TOKEN = "benchmark-admin-token-000001"


class Order(BaseModel):
    order_id: str


class Shipped(BaseModel):
    tracking: str


class OrderState(BaseModel):
    shipped: Shipped | None = None


@flowx.capability("bench.api.note", version="1.0.0")
async def note(ctx: flowx.StepContext, order: Order) -> str:
    return "ok"


PLAN = (
    flowx.flow("bench.api", version="1.0.0", input=Order, state=OrderState)
    .await_signal("shipped", Shipped, into="shipped", timeout="1d")
    .build()
)


async def _timed(calls: list[Callable[[], Awaitable[Any]]], concurrency: int) -> list[float]:
    """Run ``calls`` with ``concurrency`` in flight; each call's latency in ms."""
    latencies: list[float] = []
    queue = iter(calls)

    async def lane() -> None:
        for call in queue:
            began = time.perf_counter()
            await call()
            latencies.append((time.perf_counter() - began) * 1000)

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return latencies


def _summary(latencies: list[float], wall: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1], 2),
    }


async def _round(
    via: str, host: flowx.FlowHost, client: httpx.AsyncClient, count: int, concurrency: int
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    ids: list[str] = []

    async def start_api(i: int) -> None:
        body = {"input": {"order_id": f"{tag}-{i}"}, "idempotency_key": f"{tag}-{i}"}
        response = await client.post("/v1/flows/bench.api/instances", json=body)
        assert response.status_code == 201, response.text
        ids.append(response.json()["instance_id"])

    async def start_host(i: int) -> None:
        handle = await host.start(
            PLAN, Order(order_id=f"{tag}-{i}"), idempotency_key=f"{tag}-{i}", run_here=False
        )
        ids.append(handle.instance_id)

    async def signal_api(iid: str) -> None:
        body = {"name": "shipped", "payload": {"tracking": iid[:8]}, "key": f"k-{iid}"}
        response = await client.post(f"/v1/instances/{iid}/signals", json=body)
        assert response.status_code == 200, response.text

    async def signal_host(iid: str) -> None:
        await host.signal(iid, "shipped", Shipped(tracking=iid[:8]), key=f"k-{iid}", run_here=False)

    start = start_api if via == "api" else start_host
    signal = signal_api if via == "api" else signal_host
    began = time.perf_counter()
    starts = await _timed([lambda i=i: start(i) for i in range(count)], concurrency)  # type: ignore[misc]
    start_wall = time.perf_counter() - began
    began = time.perf_counter()
    signals = await _timed([lambda iid=iid: signal(iid) for iid in ids], concurrency)  # type: ignore[misc]
    signal_wall = time.perf_counter() - began
    return {
        "via": via,
        "start": _summary(starts, start_wall),
        "signal": _summary(signals, signal_wall),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    settings = flowx.HostSettings.load(api_token=TOKEN, recovery=False, timers=False)
    host = flowx.FlowHost(store=flowx.from_url(args.db), flows=[PLAN], settings=settings)
    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as flowx serve binds it
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(host), log_config=None, access_log=False, lifespan="off")
    )
    rounds: list[dict[str, Any]] = []
    async with host:
        serving = asyncio.ensure_future(server.serve([sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        # TCP_NODELAY, as curl and most clients set it: httpx writes a POST's headers and body
        # apart, and without it the body waits ~40 ms for the server's delayed ACK.
        transport = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=args.concurrency),
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        )
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            transport=transport,
            timeout=60,
        ) as client:
            await _round("api", host, client, 50, args.concurrency)  # warm both paths
            await _round("host", host, client, 50, args.concurrency)
            for r in range(args.rounds):
                order = ("api", "host") if r % 2 == 0 else ("host", "api")
                for via in order:
                    rounds.append(await _round(via, host, client, args.count, args.concurrency))
        server.should_exit = True
        await serving
    return {"db": flowx.from_url(args.db).describe(), "rounds": rounds}


def _medians(rounds: list[dict[str, Any]], via: str, op: str) -> dict[str, float]:
    rows = [r[op] for r in rounds if r["via"] == via]
    return {k: round(statistics.median(row[k] for row in rows), 2) for k in rows[0]}


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    record = asyncio.run(main(args))
    record.update(concurrency=args.concurrency, count=args.count)
    summary = {
        op: {via: _medians(record["rounds"], via, op) for via in ("api", "host")}
        for op in ("start", "signal")
    }
    record["summary"] = summary
    backend = "sqlite" if args.db.startswith("sqlite") else "postgresql"
    out = args.out or RESULTS / f"api_throughput-{backend}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{record['db']}, {args.concurrency} in flight, {args.rounds} interleaved rounds")
    print("| op | via | per s | p50 ms | p99 ms | API / in-process |")
    print("|---|---|---|---|---|---|")
    for op, by in summary.items():
        for via in ("host", "api"):
            s = by[via]
            ratio = by["api"]["per_s"] / by["host"]["per_s"] if via == "api" else 1.0
            print(
                f"| {op} | {via} | {s['per_s']:,.0f} | {s['p50_ms']} | {s['p99_ms']} "
                f"| {ratio:.2f}× |"
            )
    print(f"wrote {out}")


if __name__ == "__main__":
    run()
