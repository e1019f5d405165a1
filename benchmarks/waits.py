"""Waits: what a signal and a durable timer cost, and how late they wake (R2.10, R2.11, R6.3).

Three measurements through the real engine on a real store:

- **park**: N instances run one step and seal themselves ``Suspended`` on a signal; instances
  parked per second. Before it, untimed, as many instances as run at once are parked and
  signalled to their end, so no store is timed while it opens its connections.
- **signal**: each one is sent its signal (``host.signal``, concurrently) and runs to the end;
  signals per second. Then, on an idle node, 50 signals one at a time: the latency from the
  ``signal`` call to the wait's own journal row.
- **timer**: N instances sleep for ``--sleep`` seconds, all falling due together: how long
  until the last is done, and how late each woke (the sleep row's commit time minus its
  ``wake_at``). Then 50 sleepers falling due 20 ms apart: how late each woke when the node is
  not busy.

    python -m benchmarks.waits --store postgresql://postgres@127.0.0.1:5432/test
    python -m benchmarks.waits --store postgresql://… --against-sqlite --rounds 5

Writes ``benchmarks/results/waits-<backend>.json`` (``waits-compare.json`` for the second,
which runs each store in turn, a process each, and reports PostgreSQL/SQLite ratios) and
prints a table. It asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from pydantic import BaseModel

import flowx
from flowx.stores.records import InstanceState
from flowx.urls import take_params

RESULTS = Path(__file__).resolve().parent / "results"


class Job(BaseModel):
    n: int


class Go(BaseModel):
    at: float


class JobState(BaseModel):
    go: Go | None = None
    done: int | None = None


class Progress:
    """Steps run, counted by flow and step name: the timed phases wait on these counts (and
    then for the node to be idle) rather than polling the store, which on a busy node would
    load the very store being measured. Each phase's outcome is checked after its clock stops."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._waiters: list[tuple[str, int, asyncio.Future[None]]] = []

    def tick(self, key: str) -> None:
        self.counts[key] += 1
        for waiter in [w for w in self._waiters if self.counts[w[0]] >= w[1]]:
            self._waiters.remove(waiter)
            if not waiter[2].done():
                waiter[2].set_result(None)

    async def reach(self, key: str, target: int) -> None:
        if self.counts[key] >= target:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((key, target, future))
        await asyncio.wait_for(future, timeout=600)


PROGRESS = Progress()


@flowx.capability("bench.wait.work", version="1.0.0")
async def work(ctx: flowx.StepContext, job: Job) -> int:
    PROGRESS.tick(f"{ctx.flow_id}:{ctx.step_name}")
    return job.n


signalled = (
    flowx.flow("bench.wait.signal", version="1", input=Job, state=JobState)
    .step(work, name="before")
    .await_signal("go", Go, into="go")
    .step(work, name="after", into="done")
    .build()
)


def sleeper(seconds: float) -> flowx.Plan:
    return (
        flowx.flow("bench.wait.sleep", version="1", input=Job, state=JobState)
        .sleep(f"{int(seconds * 1000)}ms", name="nap")
        .step(work, name="wake", into="done")
        .build()
    )


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def _until(host: flowx.FlowHost, ids: list[str], state: InstanceState) -> None:
    """Poll a sample, then check every id once: polling all of them would load the store."""
    assert host.store is not None
    journal = host.store.journal
    left = list(ids)
    while left:
        sample = left[-10:]
        seen = [await journal.get(i) for i in sample]
        if all(r is not None and r.state is state for r in seen):
            left = [i for i in left if (await journal.get(i)).state is not state]  # type: ignore[union-attr]
        if left:
            await asyncio.sleep(0.05)


async def _phase(host: flowx.FlowHost, key: str, target: int) -> None:
    """Until ``target`` runs of step ``key`` in all, then until every run has ended."""
    await PROGRESS.reach(key, target)
    await host.wait_idle(timeout=600)


async def _check(host: flowx.FlowHost, ids: list[str], state: InstanceState) -> None:
    """After the clock stops: every instance is where the phase left it."""
    assert host.store is not None
    for iid in ids:
        record = await host.store.journal.get(iid)
        assert record is not None and record.state is state, (iid, record)


async def _lateness(host: flowx.FlowHost, ids: list[str]) -> list[float]:
    assert host.store is not None
    late: list[float] = []
    for iid in ids[:: max(1, len(ids) // 500)]:
        record = await host.store.journal.get(iid)
        rows = await host.store.journal.steps(iid)
        nap = next(r for r in rows if r.step_name == "nap")
        assert record is not None and record.wake_at is not None
        late.append((nap.committed_at - record.wake_at).total_seconds() * 1000)
    return late


async def _signal_latency(host: flowx.FlowHost, ids: list[str]) -> list[float]:
    assert host.store is not None
    out: list[float] = []
    for iid in ids:
        await host.signal(iid, "go", Go(at=time.time()))
        await _until(host, [iid], InstanceState.COMPLETED)
        rows = await host.store.journal.steps(iid)
        sig = next(r for r in rows if r.step_name == "go")
        sent = flowx.codec.loads(sig.result)["payload"]["at"]
        out.append((sig.committed_at.timestamp() - sent) * 1000)
    return out


async def _warm(host: flowx.FlowHost, start: Any, count: int) -> None:
    """Untimed, on both stores alike: ``count`` instances parked at once and signalled to
    their end, so the timed phases find the node as it runs for good (its connections open
    and their statements prepared), not as it opens."""
    before, after = "bench.wait.signal:before", "bench.wait.signal:after"
    parked, ended = PROGRESS.counts[before] + count, PROGRESS.counts[after] + count
    ids = list(await asyncio.gather(*(start(-1 - n, signalled) for n in range(count))))
    await _phase(host, before, parked)
    await asyncio.gather(*(host.signal(i, "go", Go(at=time.time())) for i in ids))
    await _phase(host, after, ended)


async def run(url: str, instances: int, sleep_s: float, concurrency: int) -> dict[str, Any]:
    plan_sleep = sleeper(sleep_s)
    settings = flowx.HostSettings(max_concurrent_flows=max(concurrency, 64))
    async with flowx.FlowHost(
        store=flowx.from_url(url), flows=[signalled, plan_sleep], settings=settings
    ) as host:
        assert host.store is not None
        # park
        sem = asyncio.Semaphore(concurrency)

        async def start(n: int, plan: flowx.Plan) -> str:
            async with sem:
                return (await host.start(plan, Job(n=n))).instance_id

        before, after = "bench.wait.signal:before", "bench.wait.signal:after"
        await _warm(host, start, concurrency)
        started = time.perf_counter()
        target = PROGRESS.counts[before] + instances
        ids = list(await asyncio.gather(*(start(n, signalled) for n in range(instances))))
        await _phase(host, before, target)
        park_s = time.perf_counter() - started
        await _check(host, ids, InstanceState.SUSPENDED)

        # signal
        started = time.perf_counter()

        async def send(iid: str) -> None:
            async with sem:
                receipt = await host.signal(iid, "go", Go(at=time.time()), key=f"k-{iid}")
                assert receipt.status == "woken", receipt

        target = PROGRESS.counts[after] + instances
        await asyncio.gather(*(send(i) for i in ids))
        await _phase(host, after, target)
        signal_s = time.perf_counter() - started
        await _check(host, ids, InstanceState.COMPLETED)
        probes = list(await asyncio.gather(*(start(n, signalled) for n in range(50))))
        await _until(host, probes, InstanceState.SUSPENDED)
        latencies = await _signal_latency(host, probes)

        # timer: a burst falling due together, then a trickle on an idle node
        woke = "bench.wait.sleep:wake"
        target = PROGRESS.counts[woke] + instances
        started = time.perf_counter()
        sleepers = list(await asyncio.gather(*(start(n, plan_sleep) for n in range(instances))))
        await _phase(host, woke, target)
        timer_s = time.perf_counter() - started
        await _check(host, sleepers, InstanceState.COMPLETED)
        lateness = await _lateness(host, sleepers)
        trickle = []
        for n in range(50):
            trickle.append((await host.start(plan_sleep, Job(n=n))).instance_id)
            await asyncio.sleep(0.02)
        await _until(host, trickle, InstanceState.COMPLETED)
        idle_lateness = await _lateness(host, trickle)

    return {
        "instances": instances,
        "concurrency": concurrency,
        "park_per_s": round(instances / park_s, 1),
        "signals_per_s": round(instances / signal_s, 1),
        "idle_signal_to_row_p50_ms": round(statistics.median(latencies), 2),
        "idle_signal_to_row_max_ms": round(max(latencies), 2),
        "sleep_s": sleep_s,
        "burst_sleepers_done_s": round(timer_s, 2),
        "burst_timer_late_p50_ms": round(statistics.median(lateness), 2),
        "burst_timer_late_max_ms": round(max(lateness), 2),
        "idle_timer_late_p50_ms": round(statistics.median(idle_lateness), 2),
        "idle_timer_late_max_ms": round(max(idle_lateness), 2),
    }


def _one(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in a process of its own (the other store's run leaves nothing here)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "waits.json"
        cmd = [sys.executable, "-m", "benchmarks.waits", "--out", str(out)]
        cmd += ["--instances", str(args.instances), "--sleep", str(args.sleep)]
        cmd += ["--concurrency", str(args.concurrency)]
        if url != "sqlite":
            cmd += ["--store", url]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        result: dict[str, Any] = json.loads(out.read_text())["result"]
        return result


def compare(args: argparse.Namespace) -> None:
    """PostgreSQL against SQLite, interleaved round by round (the order alternating): the
    per-round PostgreSQL/SQLite ratios of parks/s and signals/s, and their medians."""
    stores = (args.store, "sqlite")
    rounds: list[dict[str, dict[str, Any]]] = []
    for r in range(args.rounds):
        order = stores if r % 2 == 0 else tuple(reversed(stores))
        got = {("postgresql" if s != "sqlite" else "sqlite"): _one(s, args) for s in order}
        rounds.append(got)
        pg, sq = got["postgresql"], got["sqlite"]
        print(
            f"round {r + 1}/{args.rounds}: parks/s {pg['park_per_s']} vs {sq['park_per_s']}, "
            f"signals/s {pg['signals_per_s']} vs {sq['signals_per_s']}",
            flush=True,
        )
    summary = {}
    for key in ("park_per_s", "signals_per_s"):
        pg = [r["postgresql"][key] for r in rounds]
        sq = [r["sqlite"][key] for r in rounds]
        summary[key] = {
            "postgresql": statistics.median(pg),
            "sqlite": statistics.median(sq),
            "postgresql_over_sqlite": round(
                statistics.median(a / b for a, b in zip(pg, sq, strict=True)), 3
            ),
        }
    out = {
        "benchmark": "waits, PostgreSQL against SQLite",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "instances": args.instances,
        "concurrency": args.concurrency,
        "rounds": rounds,
        "summary": summary,
    }
    path = args.out or RESULTS / "waits-compare.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"medians of {args.rounds} interleaved rounds, {args.instances} instances")
    for key, row in summary.items():
        print(
            f"  {key:>14}  PostgreSQL {row['postgresql']:>8}  SQLite {row['sqlite']:>8}  "
            f"ratio {row['postgresql_over_sqlite']}"
        )
    print(f"written to {path}")


def _drop_schema(dsn: str, schema: str) -> None:
    """Drop the schema a run made for itself (its rows are of no use once measured)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", default=None, help="store URL (default: a fresh SQLite file)")
    parser.add_argument("--instances", type=int, default=2000)
    parser.add_argument("--sleep", type=float, default=2.0, help="seconds each sleeper sleeps")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--against-sqlite",
        action="store_true",
        help="with a PostgreSQL --store: run it and SQLite interleaved, --rounds times",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    args = parser.parse_args()
    if args.against_sqlite:
        if not (args.store or "").startswith("postgres"):
            parser.error("--against-sqlite needs a PostgreSQL --store")
        compare(args)
        return
    url = args.store
    own_schema: str | None = None  # made here, so dropped here once measured
    if url is None:
        url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'waits.db'}"
    elif url.startswith("postgres") and "flowx_schema" not in url:
        sep = "&" if "?" in url else "?"
        own_schema = f"bench_waits_{uuid.uuid4().hex[:8]}"
        url = f"{url}{sep}flowx_schema={own_schema}"
    backend = "postgresql" if url.startswith("postgres") else "sqlite"
    try:
        result = asyncio.run(run(url, args.instances, args.sleep, args.concurrency))
    finally:
        if own_schema is not None:
            _drop_schema(
                take_params(args.store, lambda key: key.startswith("flowx_"))[0], own_schema
            )
    out = {
        "benchmark": "waits",
        "store": backend,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "result": result,
    }
    path = args.out or RESULTS / f"waits-{backend}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"waits on {backend}: {args.instances} instances, concurrency {args.concurrency}")
    for key, value in result.items():
        print(f"  {key:>24}  {value}")
    print(f"written to {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main()
