"""Outbox throughput and lag on PostgreSQL with Redis Streams as the broker (SPEC §5).

* **drain**: N events over ``--keys`` partition keys (16 by default) are staged (through
  the journal's own commit, 10 events a commit), then 1 or 4 publishers drain them to Redis;
  events/s is N over the time from the first claim to the last acknowledgement.
* **lag**: events are staged at a steady rate while publishers drain; a consumer reads the
  streams with XREAD BLOCK, and the lag of each event is the time from the start of its
  staging commit to the consumer reading it. "woken" runs the publisher beside the stager,
  woken by each commit as ``FlowHost`` does; "polling" gives it no wake-ups, as for a
  publisher in another process.

    python -m benchmarks.outbox [--events 100000] [--rate 2000] [--seconds 10]

Writes ``benchmarks/results/outbox.json`` and prints a table. It asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from flowx.outbox import OutboxPublisher, RedisStreamsPublisher
from flowx.stores.postgres import PostgresStores
from flowx.stores.records import EventWrite, NewInstance, Outcome, StepCommit, StepWrite

RESULTS = Path(__file__).resolve().parent / "results"
PG = os.environ.get("FLOWX_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("FLOWX_BENCH_REDIS", "redis://127.0.0.1:6379/0")
EVENTS_PER_COMMIT = 10
KEYS = 16


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else float("nan")


class Stager:
    """Instances that commit steps carrying events, one commit per instance at a time."""

    def __init__(self, stores: PostgresStores, instances: int) -> None:
        self.stores = stores
        self.ids = [str(uuid.uuid4()) for _ in range(instances)]
        self.step = dict.fromkeys(self.ids, 0)

    async def create(self) -> None:
        now = datetime.now(UTC)
        for iid in self.ids:
            await self.stores.journal.create(
                NewInstance(
                    instance_id=iid,
                    flow_id="bench.outbox",
                    flow_version="1",
                    input="{}",
                    state_bag="{}",
                ),
                token=1,
                now=now,
            )

    async def commit(self, iid: str) -> None:
        self.step[iid] += 1
        n = self.step[iid]
        t0 = time.time()
        events = tuple(
            EventWrite(
                event_id=str(uuid.uuid4()),
                type="bench.tick",
                schema_version="1",
                partition_key=f"k{(hash(iid) + i) % KEYS}",
                payload=json.dumps({"t0": t0, "i": i}),
            )
            for i in range(EVENTS_PER_COMMIT)
        )
        await self.stores.journal.commit(
            StepCommit(
                instance_id=iid,
                token=1,
                now=datetime.now(UTC),
                step=StepWrite(
                    scope="",
                    step_id=n,
                    attempt=1,
                    step_name=f"s{n}",
                    outcome=Outcome.SUCCESS,
                    result="null",
                ),
                events=events,
            )
        )


async def fresh(schema: str) -> PostgresStores:
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')  # type: ignore[arg-type]
    stores = PostgresStores(PG, schema=schema)
    await stores.open()
    return stores


async def drop_streams(prefix: str) -> None:
    from redis import asyncio as aioredis

    client: Any = aioredis.Redis.from_url(REDIS)
    keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def stage_all(stores: PostgresStores, events: int) -> float:
    """Stage ``events`` through 200 instances committing concurrently; the seconds it took."""
    stager = Stager(stores, 200)
    await stager.create()
    per = events // EVENTS_PER_COMMIT // len(stager.ids)

    async def run_instance(iid: str) -> None:
        for _ in range(per):
            await stager.commit(iid)

    t = time.perf_counter()
    await asyncio.gather(*(run_instance(i) for i in stager.ids))
    return time.perf_counter() - t


async def drain(events: int, publishers: int) -> dict[str, Any]:
    schema = "flowx_bench_outbox"
    stores = await fresh(schema)
    prefix = f"bench-outbox-{uuid.uuid4().hex[:6]}:"
    try:
        staging_s = await stage_all(stores, events)
        staged = await stores.outbox.pending_count()
        relays = [
            OutboxPublisher(
                stores.outbox, RedisStreamsPublisher(REDIS, prefix=prefix), owner=f"p{n}"
            )
            for n in range(publishers)
        ]
        started = time.perf_counter()
        counts = await asyncio.gather(*(r.drain() for r in relays))
        while await stores.outbox.pending_count():
            counts = [
                c + d
                for c, d in zip(
                    counts, await asyncio.gather(*(r.drain() for r in relays)), strict=True
                )
            ]
        elapsed = time.perf_counter() - started
        for r in relays:
            await r.publisher.close()
        return {
            "mode": "drain",
            "publishers": publishers,
            "events": staged,
            "staging_s": round(staging_s, 2),
            "staged_per_s": round(staged / staging_s),
            "seconds": round(elapsed, 2),
            "events_per_s": round(sum(counts) / elapsed),
            "published": sum(counts),
            "per_publisher": counts,
        }
    finally:
        await stores.close()
        await drop_streams(prefix)


async def drain_worker(schema: str, prefix: str, owner: str) -> None:
    """One publisher process of the multi-process drain: publish until nothing is pending."""
    stores = PostgresStores(PG, schema=schema)
    await stores.open()
    relay = OutboxPublisher(stores.outbox, RedisStreamsPublisher(REDIS, prefix=prefix), owner=owner)
    total = 0
    try:
        while True:
            total += await relay.drain()
            if not await stores.outbox.pending_count():
                break
    finally:
        await relay.publisher.close()
        await stores.close()
    print(json.dumps({"owner": owner, "published": total}))


async def drain_processes(events: int, processes: int) -> dict[str, Any]:
    """The drain with each publisher in a process of its own, as workers would run."""
    schema = "flowx_bench_outbox"
    stores = await fresh(schema)
    prefix = f"bench-outbox-{uuid.uuid4().hex[:6]}:"
    try:
        await stage_all(stores, events)
        staged = await stores.outbox.pending_count()
        started = time.perf_counter()
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "benchmarks.outbox",
                "--drain-worker",
                schema,
                prefix,
                f"p{n}",
                stdout=asyncio.subprocess.PIPE,
            )
            for n in range(processes)
        ]
        outs = [json.loads((await p.communicate())[0]) for p in procs]
        elapsed = time.perf_counter() - started
        counts = [o["published"] for o in outs]
        return {
            "mode": "drain",
            "publishers": f"{processes} processes",
            "events": staged,
            "seconds": round(elapsed, 2),
            "events_per_s": round(sum(counts) / elapsed),
            "published": sum(counts),
            "per_publisher": counts,
            "note": "includes each process's start-up and connection time",
        }
    finally:
        await stores.close()
        await drop_streams(prefix)


async def lag(rate: int, seconds: float, publishers: int, woken: bool) -> dict[str, Any]:
    from redis import asyncio as aioredis

    schema = "flowx_bench_outbox"
    stores = await fresh(schema)
    prefix = f"bench-outbox-{uuid.uuid4().hex[:6]}:"
    client: Any = aioredis.Redis.from_url(REDIS, decode_responses=True)
    lags: list[float] = []
    expected = 0
    try:
        stager = Stager(stores, 64)
        await stager.create()
        relays = [
            OutboxPublisher(
                stores.outbox, RedisStreamsPublisher(REDIS, prefix=prefix), owner=f"p{n}"
            )
            for n in range(publishers)
        ]
        stop = asyncio.Event()
        loops = [asyncio.create_task(r.run(stop)) for r in relays]
        streams = {f"{prefix}k{k}": "0-0" for k in range(KEYS)}
        done_reading = asyncio.Event()

        async def consume() -> None:
            while not (done_reading.is_set() and len(lags) >= expected):
                got = await client.xread(streams, block=200, count=1000)
                now = time.time()
                for name, entries in got or []:
                    for entry_id, fields in entries:
                        streams[name] = entry_id
                        lags.append(now - json.loads(fields["payload"])["t0"])

        consumer = asyncio.create_task(consume())
        commits_per_s = rate / EVENTS_PER_COMMIT
        interval = 1 / commits_per_s
        t_start = time.perf_counter()
        k = 0
        inflight: set[asyncio.Task[None]] = set()
        while time.perf_counter() - t_start < seconds:
            iid = stager.ids[k % len(stager.ids)]
            k += 1
            task = asyncio.create_task(stager.commit(iid))
            if woken:
                task.add_done_callback(lambda _t: [r.wake() for r in relays])
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            expected += EVENTS_PER_COMMIT
            next_at = t_start + k * interval
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        await asyncio.gather(*inflight)
        done_reading.set()
        await asyncio.wait_for(consumer, timeout=60)
        stop.set()
        await asyncio.gather(*loops)
        for r in relays:
            await r.publisher.close()
        ms = [x * 1000 for x in lags]
        return {
            "mode": "lag",
            "publishers": publishers,
            "wake": "woken" if woken else "polling",
            "rate_events_per_s": rate,
            "seconds": seconds,
            "events": len(lags),
            "lag_ms_p50": round(pct(ms, 50), 1),
            "lag_ms_p99": round(pct(ms, 99), 1),
            "lag_ms_max": round(max(ms), 1),
        }
    finally:
        await client.aclose()
        await stores.close()
        await drop_streams(prefix)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| mode | publishers | events | events/s | lag p50 | lag p99 | lag max |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["mode"] == "drain":
            lines.append(
                f"| drain | {r['publishers']} | {r['events']:,} | {r['events_per_s']:,} "
                "| – | – | – |"
            )
        else:
            lines.append(
                f"| lag, {r['rate_events_per_s']:,}/s staged, {r['wake']} | {r['publishers']} | "
                f"{r['events']:,} | – | {r['lag_ms_p50']} ms | {r['lag_ms_p99']} ms "
                f"| {r['lag_ms_max']} ms |"
            )
    return "\n".join(lines)


async def main() -> None:
    global KEYS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--rate", type=int, default=2_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument(
        "--drain-worker", nargs=3, metavar=("SCHEMA", "PREFIX", "OWNER"), help=argparse.SUPPRESS
    )
    ap.add_argument("--keys", type=int, default=KEYS, help="partition keys (default 16)")
    ap.add_argument("--only", choices=["drain", "lag"], default=None)
    args = ap.parse_args()
    if args.drain_worker:
        await drain_worker(*args.drain_worker)
        return
    KEYS = args.keys
    rows = []
    if args.only in (None, "drain"):
        rows += [
            await drain(args.events, 1),
            await drain(args.events, 4),
            await drain_processes(args.events, 4),
        ]
    if args.only in (None, "lag"):
        for publishers, woken in ((1, True), (1, False), (4, True)):
            rows.append(await lag(args.rate, args.seconds, publishers, woken))
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "outbox",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "store": "postgresql",
        "broker": "redis-streams",
        "events_per_commit": EVENTS_PER_COMMIT,
        "keys": KEYS,
        "batch_size": 500,
        "results": rows,
    }
    name = "outbox.json" if KEYS == 16 and args.only is None else f"outbox-{KEYS}keys.json"
    (RESULTS / name).write_text(json.dumps(out, indent=2) + "\n")
    print(table(rows))


if __name__ == "__main__":
    asyncio.run(main())
