"""Wake-ups: how long a start or a signal from another process waits before its first step.

A ``flowx worker`` runs as its own process (default sweep interval, 10 s); this process is a
second node that only starts and signals (``run_here=False``, no recovery, no timers), as a
web front end or ``flowx start`` would. For each sample it notes the wall clock, starts an
instance (or signals a suspended one), and the flow's next step writes the wall clock it ran
at into the journal: the difference is the latency.

Two modes, interleaved round by round in one run: ``wakeups`` (the default: LISTEN/NOTIFY on
PostgreSQL, ``data_version`` on SQLite) and ``sweeps`` (``FLOWX_WAKEUPS=0``: the work waits
for the worker's next sweep, as before wake-ups existed). Sweep-mode samples take seconds each,
so there are fewer of them (``--sweep-samples``).

    python -m benchmarks.wakeups                       # SQLite in a temporary folder
    python -m benchmarks.wakeups --store postgresql://postgres@127.0.0.1:5432/test

Writes ``benchmarks/results/wakeups-<backend>.json`` and prints a table. It asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import flowx
from flowx.stores.records import InstanceState

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


class Job(BaseModel):
    n: int


class Go(BaseModel):
    ok: bool = True


class Stamped(BaseModel):
    go: Go | None = None
    ran_at: float | None = None


@flowx.capability("bench.wake.stamp", version="1.0.0")
async def stamp(ctx: flowx.StepContext, job: Job) -> float:
    return time.time()


@flowx.capability("bench.wake.noop", version="1.0.0")
async def noop(ctx: flowx.StepContext, job: Job) -> int:
    return job.n


started = (
    flowx.flow("bench.wake.start", version="1", input=Job, state=Stamped)
    .step(stamp, into="ran_at")
    .build()
)
signalled = (
    flowx.flow("bench.wake.signal", version="1", input=Job, state=Stamped)
    .step(noop)
    .await_signal("go", Go, into="go", timeout="1h")
    .step(stamp, into="ran_at")
    .build()
)
FLOWS = [started, signalled]


def _worker(url: str, ready: Path, wakeups: bool) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "FLOWX_WAKEUPS": "1" if wakeups else "0",
        "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path]),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "flowx.cli.main", "worker", "--db", url,
         "--flows", "benchmarks.wakeups:FLOWS", "--ready-file", str(ready),
         "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


async def _until(check: Callable[[], Awaitable[bool]], within: float) -> None:
    ends = time.monotonic() + within
    while not await check():
        if time.monotonic() > ends:
            raise TimeoutError("the worker did not run the instance")
        await asyncio.sleep(0.002)


async def _ran_at(host: flowx.FlowHost, iid: str, within: float) -> float:
    seen: list[flowx.InstanceRecord] = []

    async def done() -> bool:
        seen.append(await host.get(iid))
        return seen[-1].state is InstanceState.COMPLETED

    await _until(done, within)
    ran = Stamped.model_validate_json(seen[-1].state_bag).ran_at
    assert ran is not None
    return ran


async def _sample_start(host: flowx.FlowHost, n: int, within: float) -> float:
    sent = time.time()
    handle = await host.start(started, Job(n=n), run_here=False)
    return (await _ran_at(host, handle.instance_id, within)) - sent


async def _sample_signal(host: flowx.FlowHost, n: int, within: float) -> float:
    handle = await host.start(signalled, Job(n=n), run_here=False)
    iid = handle.instance_id

    async def parked() -> bool:
        return (await host.get(iid)).state is InstanceState.SUSPENDED

    await _until(parked, within)
    sent = time.time()
    await host.signal(iid, "go", Go(), run_here=False)
    return (await _ran_at(host, iid, within)) - sent


async def _round(url: str, wakeups: bool, samples: int, folder: Path) -> dict[str, list[float]]:
    ready = folder / f"ready-{uuid.uuid4().hex[:6]}"
    proc = _worker(url, ready, wakeups)
    host = flowx.FlowHost(
        store=flowx.from_url(url),
        flows=FLOWS,
        settings=flowx.HostSettings.load(recovery=False, timers=False),
    )
    try:
        while not ready.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited: {proc.communicate()[1]}")
            await asyncio.sleep(0.02)
        await host.open()
        within = 60.0
        out: dict[str, list[float]] = {"start": [], "signal": []}
        for i in range(samples):
            out["start"].append(await _sample_start(host, i, within))
            out["signal"].append(await _sample_signal(host, i, within))
        return out
    finally:
        await host.drain(timeout=5)
        proc.terminate()
        proc.communicate(timeout=30)


def _drop_schema(dsn: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "n": len(values),
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "p99_ms": round(p99 * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=None, help="a PostgreSQL URL (default: SQLite)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=100, help="per round, wake-up mode")
    parser.add_argument("--sweep-samples", type=int, default=4, help="per round, sweep mode")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.store is None:
            url, backend = f"sqlite:///{folder / 'wake.db'}", "sqlite"
        else:
            schema = f"bench_wake_{uuid.uuid4().hex[:8]}"
            sep = "&" if "?" in args.store else "?"
            url, backend = f"{args.store}{sep}flowx_schema={schema}", "postgresql"
        modes = {"wakeups": (True, args.samples), "sweeps": (False, args.sweep_samples)}
        seen: dict[str, dict[str, list[float]]] = {m: {"start": [], "signal": []} for m in modes}
        for r in range(args.rounds):
            for mode, (on, samples) in modes.items():
                got = await _round(url, on, samples, folder)
                for kind, values in got.items():
                    seen[mode][kind].extend(values)
                print(f"round {r + 1}/{args.rounds} {mode}: done", file=sys.stderr)
        if backend == "postgresql":
            _drop_schema(args.store, schema)
    table = {mode: {kind: _ms(v) for kind, v in kinds.items()} for mode, kinds in seen.items()}
    fast = table["wakeups"]
    result: dict[str, Any] = {
        "benchmark": "wakeups",
        "backend": backend,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "rounds": args.rounds,
        "latency": table,
        "p50_ratio_sweeps_over_wakeups": {
            kind: round(table["sweeps"][kind]["p50_ms"] / max(fast[kind]["p50_ms"], 0.1), 1)
            for kind in ("start", "signal")
        },
    }
    out = args.out or RESULTS / f"wakeups-{backend}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\ncross-process latency to the next step ({backend}), {args.rounds} rounds")
    print(f"{'mode':<9} {'what':<7} {'n':>4} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    for mode, kinds in table.items():
        for kind, row in kinds.items():
            print(
                f"{mode:<9} {kind:<7} {row['n']:>4} {row['p50_ms']:>9} {row['p99_ms']:>9} "
                f"{row['max_ms']:>9}"
            )
    print(f"p50 sweeps/wakeups: {result['p50_ratio_sweeps_over_wakeups']}  -> {out}")


if __name__ == "__main__":
    asyncio.run(main())
