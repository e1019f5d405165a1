"""Instructions per step through the engine: a figure the shared machine's noise cannot move.

Wall-clock A/B runs on this machine (2 shared cores, other tenants' steal time) spread
0.77-1.16x between rounds, so a change of a few per cent in the engine's per-step work cannot
be seen in them. Counted instructions can: this runs B7 (``benchmarks.journal_throughput``:
N flows of ``--steps`` no-op steps, 64 at once) under ``valgrind --tool=callgrind`` at two
flow counts and reports the difference per step — the instructions one more step costs,
its share of the per-flow work included, the interpreter's start-up and imports cancelled
out. ``PYTHONHASHSEED=0`` fixes the one thing that varies between runs; two runs of one tree
agree to within about 0.01 %.

It counts work, not time: a cache miss costs more than an instruction, and the database's
side is not in it. Use it beside the ceiling's wall-clock ratios (``benchmarks.ceiling``),
never instead of them. The memory store by default (the engine alone); ``--store`` takes any
URL B7 takes.

    python -m benchmarks.instructions                      # this checkout
    python -m benchmarks.instructions --before ../older     # and another, side by side

Needs ``valgrind`` (Debian: ``apt-get install valgrind``). Writes
``benchmarks/results/instructions.json`` (or ``--out``) and prints a table. A benchmark,
not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.ab_trees import revision as checked_out

RESULTS = Path(__file__).resolve().parent / "results"
HERE = Path(__file__).resolve().parent.parent

#: What each valgrind run executes: B7's ``run_level`` once, in the tree on ``PYTHONPATH``.
_RUN = (
    "import asyncio, sys\n"
    "from benchmarks.journal_throughput import make_plan, run_level\n"
    "steps, n, url = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]\n"
    "asyncio.run(run_level(url, make_plan(steps), n, 64, warm_together=True))\n"
)


def collected(tree: Path, steps: int, flows: int, store: str) -> int:
    """Instructions one run of ``flows`` flows executes, start-up included."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": f"{tree / 'src'}:{tree}"}
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-c",
            _RUN,
            str(steps),
            str(flows),
            store,
        ],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"valgrind printed no instruction count:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_step(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    low = collected(tree, args.steps, args.flows, args.store)
    high = collected(tree, args.steps, 2 * args.flows, args.store)
    return {
        "tree": str(tree),
        "commit": revision(tree),
        "instructions_at_flows": {str(args.flows): low, str(2 * args.flows): high},
        "instructions_per_step": round((high - low) / (args.flows * args.steps)),
    }


def revision(tree: Path) -> str | None:
    """The commit ``tree`` has checked out, if it is a git checkout."""
    try:
        return checked_out(tree)
    except (subprocess.CalledProcessError, OSError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="memory://", help="a URL B7 takes (memory://)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--flows", type=int, default=100, help="the lower flow count (x2 too)")
    parser.add_argument("--before", type=Path, default=None, help="another checkout's root")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (Debian: apt-get install valgrind)")
    trees = {"after": HERE} if args.before is None else {"before": args.before, "after": HERE}
    sides = {name: per_step(tree.resolve(), args) for name, tree in trees.items()}
    record = {
        "benchmark": "instructions",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count()},
        "store": args.store,
        "steps": args.steps,
        "flows": args.flows,
        "sides": sides,
    }
    if "before" in sides:
        record["after_over_before"] = round(
            sides["after"]["instructions_per_step"] / sides["before"]["instructions_per_step"], 4
        )
    out = args.out or RESULTS / "instructions.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"instructions per step, {args.steps}-step flows on {args.store} (valgrind callgrind)")
    for name, side in sides.items():
        where = side["commit"] or side["tree"]
        print(f"  {name:>6}  {where:>12}  {side['instructions_per_step']:,}")
    if "after_over_before" in record:
        print(f"  after/before: {record['after_over_before']:.3f}")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
