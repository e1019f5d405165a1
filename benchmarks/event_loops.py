"""uvloop against asyncio's own loop, through the real engine (B7), interleaved.

    python -m benchmarks.event_loops --store postgresql://postgres@127.0.0.1:5432/test

Each round runs ``benchmarks.journal_throughput`` once with each loop, in its own process,
the order alternating round by round; what is reported is the per-round uvloop/asyncio ratio
of step-commits/s at each concurrency, and its median. uvloop is a measured-only dependency
(``pip install uvloop``): FlowX adopts it only on a measured win of 1.3x or more.

Writes ``benchmarks/results/event_loops-<backend>.json`` and prints a table. It asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.ab_trees import b7_command

RESULTS = Path(__file__).resolve().parent / "results"
LOOPS = ("asyncio", "uvloop")


def one_run(loop: str, args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    cmd = [*b7_command(args), "--loop", loop, "--out", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    results: list[dict[str, Any]] = json.loads(out.read_text())["results"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=None, help="store URL (default: SQLite)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    runs: dict[str, list[dict[int, float]]] = {loop: [] for loop in LOOPS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = LOOPS if r % 2 == 0 else tuple(reversed(LOOPS))
            for loop in order:
                rows = one_run(loop, args, Path(tmp) / f"{loop}.json")
                runs[loop].append({row["concurrency"]: row["step_commits_per_s"] for row in rows})
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    table = []
    for c in levels:
        ratios = [u[c] / a[c] for a, u in zip(runs["asyncio"], runs["uvloop"], strict=True)]
        table.append(
            {
                "concurrency": c,
                "asyncio": statistics.median(run[c] for run in runs["asyncio"]),
                "uvloop": statistics.median(run[c] for run in runs["uvloop"]),
                "uvloop_over_asyncio": round(statistics.median(ratios), 3),
                "range": [round(min(ratios), 3), round(max(ratios), 3)],
            }
        )
    backend = "postgresql" if (args.store or "").startswith("postgres") else "sqlite"
    record = {
        "benchmark": "event loops (B7)",
        "store": backend,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": sys.version.split()[0], "cpus": os.cpu_count()},
        "rounds": args.rounds,
        "instances": args.instances,
        "steps": args.steps,
        "runs": {
            loop: [{str(k): v for k, v in run.items()} for run in rs] for loop, rs in runs.items()
        },
        "results": table,
    }
    out = args.out or RESULTS / f"event_loops-{backend}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"B7 step-commits/s on {backend}, {args.rounds} interleaved rounds, medians")
    print(
        f"{'concurrency':>12} {'asyncio':>10} {'uvloop':>10} {'uvloop/asyncio':>15} {'range':>14}"
    )
    for row in table:
        lo, hi = row["range"]
        print(
            f"{row['concurrency']:>12} {row['asyncio']:>10.0f} {row['uvloop']:>10.0f} "
            f"{row['uvloop_over_asyncio']:>15} {lo:>6}-{hi:<6}"
        )
    print(f"written to {out}")


if __name__ == "__main__":
    main()
