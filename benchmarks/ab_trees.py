"""B7 before/after, interleaved: each checkout's B7 run in turn, on one machine.

    python -m benchmarks.ab_trees --before ../base --after . --store postgresql://...

Each round runs each checkout's own ``benchmarks.journal_throughput`` once (order alternating
round by round), in its own process with that checkout's ``src`` first on ``PYTHONPATH``, and
reads the JSON it writes. The machine is shared and noisy: what is reported is the per-round
after/before ratio of step-commits/s at each concurrency, and its median.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def b7_command(args: argparse.Namespace, side: str = "") -> list[str]:
    """B7 (``benchmarks.journal_throughput``) as ``args`` (instances, steps, concurrency,
    store) ask for it, in a process of its own. On PostgreSQL each side gets a schema of its
    own (``flowx_ab_<side>``): two trees at different schema versions cannot share one (the
    older refuses a journal the newer migrated)."""
    cmd = [sys.executable, "-m", "benchmarks.journal_throughput"]
    cmd += ["--instances", str(args.instances), "--steps", str(args.steps)]
    cmd += ["--concurrency", args.concurrency]
    if args.store:
        store = args.store
        if (
            side
            and store.startswith(("postgres://", "postgresql://"))
            and "flowx_schema" not in store
        ):
            store += ("&" if "?" in store else "?") + f"flowx_schema=flowx_ab_{side}"
        cmd += ["--store", store]
    return cmd


def one_run(
    tree: Path, args: argparse.Namespace, out: Path, side: str = ""
) -> list[dict[str, Any]]:
    """One B7 run of ``tree``'s own benchmark against ``tree``'s own flowx."""
    env = dict(os.environ, PYTHONPATH=str((tree / "src").resolve()))
    cmd = b7_command(args, side)
    if side == "after" and args.after_flags:
        cmd += shlex.split(args.after_flags)
    bench = (tree / "benchmarks" / "journal_throughput.py").read_text()
    if '"--out"' in bench:
        cmd += ["--out", str(out)]
    else:  # an older tree writes where it always did
        backend = (args.store or "sqlite://").split(":", 1)[0]
        out = (
            tree / "benchmarks" / "results" / f"journal_throughput-{backend}-{args.steps}steps.json"
        )
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=tree)
    return json.loads(out.read_text())["results"]  # type: ignore[no-any-return]


def check_tree(tree: Path) -> None:
    """Refuse to measure if ``tree/src`` is not the flowx the benchmark process would import."""
    src = tree / "src"
    env = dict(os.environ, PYTHONPATH=str(src.resolve()))
    where = subprocess.run(
        [sys.executable, "-c", "import flowx; print(flowx.__file__)"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not Path(where).resolve().is_relative_to(src.resolve()):
        raise SystemExit(f"{src} is not what gets imported ({where}); pass a checkout's root")


def revision(tree: Path) -> str:
    """The commit ``tree`` has checked out (what the figures belong to)."""
    return subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, type=Path, help="the old checkout (its root)")
    parser.add_argument("--after", required=True, type=Path, help="the new checkout (its root)")
    parser.add_argument("--store", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--instances", type=int, default=500)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    parser.add_argument(
        "--after-flags",
        default="",
        help="flags for the after side's benchmark only: `--before . --after . --after-flags "
        "--trace` measures tracing switched on against off, on one tree",
    )
    args = parser.parse_args()
    check_tree(args.before)
    check_tree(args.after)
    runs: dict[str, list[list[dict[str, Any]]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            order = ["before", "after"] if n % 2 == 0 else ["after", "before"]
            for side in order:
                out = Path(tmp) / f"{side}-{n}.json"
                runs[side].append(one_run(getattr(args, side), args, out, side))
            print(f"round {n + 1}/{args.rounds} done", file=sys.stderr)
    levels = [r["concurrency"] for r in runs["before"][0]]
    table = []
    for i, level in enumerate(levels):
        b = [r[i]["step_commits_per_s"] for r in runs["before"]]
        a = [r[i]["step_commits_per_s"] for r in runs["after"]]
        ratios = [x / y for x, y in zip(a, b, strict=True)]
        table.append(
            {
                "concurrency": level,
                "before_median": statistics.median(b),
                "after_median": statistics.median(a),
                "ratio_median": round(statistics.median(ratios), 3),
                "ratio_min": round(min(ratios), 3),
                "ratio_max": round(max(ratios), 3),
                "before": b,
                "after": a,
            }
        )
    backend = (args.store or "sqlite://").split(":", 1)[0]
    record = {
        "benchmark": "B7 before/after, interleaved",
        "after_flags": args.after_flags,
        "store": backend,
        "rounds": args.rounds,
        "instances": args.instances,
        "steps": args.steps,
        "before": str(args.before),
        "after": str(args.after),
        "before_commit": revision(args.before),
        "after_commit": revision(args.after),
        "levels": table,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = args.out or RESULTS / f"journal_throughput-ab-{backend}-{args.steps}steps.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"B7 before/after on {backend}, {args.rounds} interleaved rounds, step-commits/s")
    print(f"{'concurrency':>12} {'before':>10} {'after':>10} {'after/before':>13} {'range':>14}")
    for r in table:
        print(
            f"{r['concurrency']:>12} {r['before_median']:>10.0f} {r['after_median']:>10.0f} "
            f"{r['ratio_median']:>13.3f} {r['ratio_min']:>6.3f}-{r['ratio_max']:<6.3f}"
        )


if __name__ == "__main__":
    main()
