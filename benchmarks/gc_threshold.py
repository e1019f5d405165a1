"""What CPython's garbage collector costs a busy node, at its default threshold and at FlowX's.

B7 (``journal_throughput.run_level``: the real ``FlowHost``, no-op steps, ``--steps`` each) at
``--concurrency`` flows in flight, in two arms run in one process, interleaved round by round
in alternating order, each on a fresh schema (PostgreSQL) or file (SQLite):

- ``700``: ``gc_threshold=0``: the node leaves the collector as CPython set it (700, 10, 10);
- ``10000``: the default ``gc_threshold``: the node raises the young threshold to 10,000
  while it is open (``flowx.hosting.collector``).

Per arm and round: step-commits/s, the process's CPU time per step (``time.process_time``,
the database server's not included), and the time spent in collections per step with the
number of collections of each generation (``gc.callbacks``: wall time from each
collection's start to its stop). Medians over rounds, and the ratio 10000/700 of
step-commits/s (median of each round's ratio), printed as a table and written as JSON.
A benchmark, not a test: it asserts nothing about speed.

    python -m benchmarks.gc_threshold --store postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import secrets
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.ceiling import drop_schemas, migrate, with_schema
from benchmarks.journal_throughput import make_plan, run_level

RESULTS = Path(__file__).resolve().parent / "results"
#: Each arm's ``gc_threshold`` setting, by the young threshold the run has.
ARMS = {"700": 0, "10000": 10_000}


class Collections:
    """Counts collections per generation, and the time from each one's start to its stop."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.count[info["generation"]] += 1


async def one_arm(
    url: str, arm: str, steps: int, instances: int, concurrency: int
) -> dict[str, Any]:
    seen = Collections()
    gc.callbacks.append(seen)
    cpu = time.process_time()
    try:
        result = await run_level(
            url,
            make_plan(steps),
            instances,
            concurrency,
            warm_together=True,
            settings={"gc_threshold": ARMS[arm]},
        )
    finally:
        gc.callbacks.remove(seen)
    step_commits = instances * steps
    return {
        "arm": arm,
        "step_commits_per_s": result["step_commits_per_s"],
        "cpu_us_per_step": round((time.process_time() - cpu) / step_commits * 1e6, 1),
        "gc_us_per_step": round(seen.seconds / step_commits * 1e6, 2),
        "collections": seen.count,
        "commit_p50_ms": result["commit_p50_ms"],
        "commit_p99_ms": result["commit_p99_ms"],
    }


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rounds: list[dict[str, Any]] = []
    schemas: list[str] = []
    postgres = args.store is not None and args.store.startswith("postgres")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for r in range(args.rounds):
                order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
                for arm in order:
                    if postgres:
                        schema = f"gc_{secrets.token_hex(4)}"
                        schemas.append(schema)
                        await migrate(args.store, schema)
                        url = with_schema(args.store, schema)
                    else:
                        url = f"sqlite:///{Path(tmp) / f'gc-{r}-{arm}.db'}"
                    done = await one_arm(url, arm, args.steps, args.instances, args.concurrency)
                    done["round"] = r + 1
                    rounds.append(done)
                    print(
                        f"round {r + 1} {arm:>6}: {done['step_commits_per_s']:>9.1f} "
                        f"step-commits/s, {done['cpu_us_per_step']:>6.1f} µs CPU and "
                        f"{done['gc_us_per_step']:>6.2f} µs in collections a step "
                        f"{done['collections']}"
                    )
        finally:
            if postgres and schemas:
                await drop_schemas(args.store, schemas)
    return rounds


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    arms: dict[str, Any] = {}
    for arm in ARMS:
        mine = [r for r in rounds if r["arm"] == arm]
        arms[arm] = {
            key: statistics.median(r[key] for r in mine)
            for key in ("step_commits_per_s", "cpu_us_per_step", "gc_us_per_step")
        }
        arms[arm]["collections_per_run"] = [
            statistics.median(r["collections"][g] for r in mine) for g in range(3)
        ]
    ratios = []
    for n in {r["round"] for r in rounds}:
        by = {r["arm"]: r for r in rounds if r["round"] == n}
        ratios.append(by["10000"]["step_commits_per_s"] / by["700"]["step_commits_per_s"])
    return {
        "arms": arms,
        "ratio_10000_over_700": round(statistics.median(ratios), 3),
        "round_ratios": [round(x, 3) for x in sorted(ratios)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=None, help="store URL (default: fresh SQLite files)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--instances", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    args = parser.parse_args()
    rounds = asyncio.run(run(args))
    backend = (args.store or "sqlite://").split(":", 1)[0]
    record = {
        "benchmark": "garbage collector threshold, B7",
        "store": backend,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "steps": args.steps,
        "instances": args.instances,
        "concurrency": args.concurrency,
        "summary": summary(rounds),
        "rounds": rounds,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = args.out or RESULTS / f"gc_threshold-{backend}-{args.steps}steps.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    s = record["summary"]
    print(
        f"B7 on {backend}, {args.instances} x {args.steps} steps, {args.concurrency} in flight, "
        f"{args.rounds} rounds, medians:"
    )
    print(
        f"{'threshold':>10} {'step-commits/s':>15} {'CPU µs/step':>12} {'GC µs/step':>11}"
        "  collections (gen 0, 1, 2)"
    )
    for arm, m in s["arms"].items():
        print(
            f"{arm:>10} {m['step_commits_per_s']:>15.1f} {m['cpu_us_per_step']:>12.1f} "
            f"{m['gc_us_per_step']:>11.2f}  {m['collections_per_run']}"
        )
    print(f"10000/700 step-commits/s: {s['ratio_10000_over_700']} (rounds {s['round_ratios']})")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
