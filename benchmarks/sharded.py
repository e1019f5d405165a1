"""Step commits per second on a journal sharded by tenant over 1, 2 and 3 PostgreSQL primaries.

3-step flows, 64 in flight, through ``FlowHost`` on ``flowx.sharded`` over throwaway clusters
of this benchmark's own (``tests.support.servers.ThrowawayPostgres``), as
``journal_throughput.py`` does on one store. Rounds are interleaved (1, 2, 3 shards, then
again in another order), so drift on a shared machine lands on every arm alike.

Reported per arm: step commits/s, each shard's commit rate, and the CPU seconds each shard's
server used (its postmaster and every backend, from ``/proc/<pid>/stat``) next to this
process's own. On this machine every shard and the client share the same few cores, so more
shards add parallel fsyncs and lock domains, not CPU: read the figures in that light.

    python -m benchmarks.sharded [--instances 1000] [--rounds 3] [--fsync on]

Writes ``benchmarks/results/sharded.json`` and prints a table. Asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from tests.support.servers import ThrowawayPostgres

import flowx
from flowx.stores.records import StepCommit
from flowx.stores.sharded import ShardedStores

RESULTS = Path(__file__).resolve().parent / "results"
TICKS = os.sysconf("SC_CLK_TCK")
IN_FLIGHT = 64


class Job(BaseModel):
    tenant: str
    n: int


class JobState(BaseModel):
    last: int | None = None


@flowx.capability("bench.shard_noop", version="1.0.0")
async def noop(ctx: flowx.StepContext, job: Job) -> int:
    return job.n


def make_plan(steps: int) -> flowx.Plan:
    builder = flowx.flow(
        "bench.sharded",
        version="1.0.0",
        input=Job,
        state=JobState,
        partition_key=lambda j: j.tenant,
    )
    for i in range(steps):
        builder.step(noop, name=f"s{i}", into="last")
    return builder.build()


class CountedJournal:
    """Delegates to the sharded journal, counting step commits by the shard they went to."""

    def __init__(self, inner: Any, store: ShardedStores) -> None:
        self._inner = inner
        self._store = store
        self.by_shard: Counter[int] = Counter()

    async def commit(self, commit: StepCommit) -> int | None:
        if commit.step is not None:
            self.by_shard[self._store.shard_of(commit.instance_id)] += 1
        return await self._inner.commit(commit)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class CountedStores:
    def __init__(self, inner: ShardedStores) -> None:
        self._inner = inner
        self.journal = CountedJournal(inner.journal, inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def cpu_of(cluster: ThrowawayPostgres) -> dict[int, float]:
    """CPU seconds (user + system) of the cluster's postmaster and each of its children."""
    seconds: dict[int, float] = {}
    for pid in cluster.processes():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # a backend that exited between listing and reading
            continue
        seconds[pid] = (int(fields[11]) + int(fields[12])) / TICKS
    return seconds


def used(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(after[pid] - before.get(pid, 0.0) for pid in after)


async def run_arm(
    clusters: list[ThrowawayPostgres], plan: flowx.Plan, instances: int, tenants: int
) -> dict[str, Any]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    inner = flowx.sharded([c.dsn for c in clusters], schema=schema)
    assert isinstance(inner, ShardedStores)  # nosec B101
    stores = CountedStores(inner)
    settings = flowx.HostSettings(max_concurrent_flows=IN_FLIGHT).replace(recovery=False)
    async with flowx.FlowHost(store=stores, flows=[plan], settings=settings) as host:
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def one(n: int) -> None:
            async with gate:
                handle = await host.start(plan, Job(tenant=f"tenant-{n % tenants}", n=n))
                await handle.result(poll=0.001)

        # Warm-up: every shard's schema, statements and connections.
        await asyncio.gather(*(one(n) for n in range(-tenants, 0)))
        stores.journal.by_shard.clear()
        cpu_before = [cpu_of(c) for c in clusters]
        client_before = time.process_time()
        started = time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(instances)))
        elapsed = time.perf_counter() - started
        client_cpu = time.process_time() - client_before
        cpu_after = [cpu_of(c) for c in clusters]
    commits = sum(stores.journal.by_shard.values())
    return {
        "shards": len(clusters),
        "instances": instances,
        "elapsed_s": round(elapsed, 3),
        "step_commits": commits,
        "step_commits_per_s": round(commits / elapsed, 1),
        "per_shard_commits_per_s": [
            round(stores.journal.by_shard[i] / elapsed, 1) for i in range(len(clusters))
        ],
        "server_cpu_s": [round(used(b, a), 2) for b, a in zip(cpu_before, cpu_after, strict=True)],
        "client_cpu_s": round(client_cpu, 2),
    }


def start_clusters(count: int, fsync: str) -> list[ThrowawayPostgres]:
    clusters = [
        ThrowawayPostgres(f"flowx-bench-shard{i}-", {"fsync": fsync, "max_connections": "300"})
        for i in range(count)
    ]
    with ThreadPoolExecutor(count) as pool:
        list(pool.map(ThrowawayPostgres.start, clusters))
    return clusters


def table(arms: list[dict[str, Any]]) -> str:
    lines = [
        f"{'shards':>6} {'commits/s (median)':>19} {'rounds':>24} "
        f"{'per shard commits/s':>28} {'server CPU s':>20} {'client CPU s':>12}"
    ]
    for arm in arms:
        lines.append(
            f"{arm['shards']:>6} {arm['median_step_commits_per_s']:>19} "
            f"{' '.join(str(r) for r in arm['rounds_step_commits_per_s']):>24} "
            f"{' / '.join(str(r) for r in arm['last']['per_shard_commits_per_s']):>28} "
            f"{' / '.join(str(r) for r in arm['last']['server_cpu_s']):>20} "
            f"{arm['last']['client_cpu_s']:>12}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shards", default="1,2,3")
    parser.add_argument("--tenants", type=int, default=64)
    parser.add_argument("--fsync", choices=["on", "off"], default="on")
    parser.add_argument("--out", type=Path, default=RESULTS / "sharded.json")
    args = parser.parse_args()
    levels = [int(s) for s in args.shards.split(",")]
    plan = make_plan(args.steps)
    clusters = start_clusters(max(levels), args.fsync)
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in levels}
    try:
        for round_no in range(args.rounds):
            order = levels[round_no % len(levels) :] + levels[: round_no % len(levels)]
            for n in order:
                arm = asyncio.run(run_arm(clusters[:n], plan, args.instances, args.tenants))
                runs[n].append(arm)
                print(f"round {round_no + 1}, {n} shard(s): {arm['step_commits_per_s']} commits/s")
    finally:
        for cluster in clusters:
            cluster.destroy()
    arms = [
        {
            "shards": n,
            "median_step_commits_per_s": statistics.median(
                r["step_commits_per_s"] for r in runs[n]
            ),
            "rounds_step_commits_per_s": [r["step_commits_per_s"] for r in runs[n]],
            "last": runs[n][-1],
            "runs": runs[n],
        }
        for n in levels
    ]
    cores = os.cpu_count()
    note = (
        f"all shards' servers and the client share this machine's {cores} cores (and other "
        "sessions' load): more shards add parallel commits, fsyncs and lock domains, not CPU"
    )
    record = {
        "benchmark": "sharded journal: step commits/s over 1..N PostgreSQL primaries",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cores": cores,
        "note": note,
        "in_flight": IN_FLIGHT,
        "steps_per_instance": args.steps,
        "instances_per_round": args.instances,
        "tenants": args.tenants,
        "fsync": args.fsync,
        "rounds": args.rounds,
        "arms": arms,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(table(arms))
    print(f"note: {note}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
