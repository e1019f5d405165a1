"""The chaos rig at full size (issues 4 and 12): real worker processes on PostgreSQL, real faults.

    python -m benchmarks.chaos                 # full: every arm at 10,000 flows (~1 h)
    python -m benchmarks.chaos --only commit_no_reply,kill_after_effect@30 --append
                                               # some arms; their rows replace the old ones
    python -m benchmarks.chaos --quick         # every arm at CI size (what tests/chaos runs)
    python -m benchmarks.chaos --arm zombie --flows 2000 --faults 5 --ttl 5
    python -m benchmarks.chaos --reanalyse     # recompute the interruption measures, print

Each arm runs on servers of its own (``benchmarks.rig.services``). Per arm: flows, faults
injected, instances lost, duplicate effects (and whether each is one a fault cut off from its
commit), writes refused, resume latency from the fault to the instance's next commit on another
process, and resumes cut short by a later fault against what chance gives
(``benchmarks.rig.interrupts``). Writes ``benchmarks/results/chaos.json``, a fault log per arm
in ``benchmarks/results/chaos-trace/``, and prints a table. The invariants are checked and
reported here too; the test suite is what asserts them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.rig.checks import invariants
from benchmarks.rig.controller import Rig, now_iso
from benchmarks.rig.interrupts import interruption_model, load
from benchmarks.rig.model import ARMS, RigConfig

RESULTS = Path(__file__).resolve().parent / "results"


def full_plan() -> list[RigConfig]:
    """The full run: every arm at 10,000 flows, the kill arm at TTL 30 s and 5 s.

    The feed is paced so the fleet is busy but not saturated on a small machine: what is
    measured is recovery, not a backlog. The kill arm keeps the 25 flows/s and 52 kills of the
    run whose TTL-30 finding README explains; the other arms run at 50 flows/s to keep the
    wall time down (each of their faults lasts long enough to find work in flight at that rate).
    """
    plan = [
        RigConfig(arm="kill_after_effect", flows=10_000, faults=52, ttl=30, scan=10, rate=25),
        RigConfig(arm="kill_after_effect", flows=10_000, faults=52, ttl=5, scan=10, rate=25),
    ]
    for arm in ARMS:
        if arm == "kill_after_effect":
            continue
        cfg = RigConfig(arm=arm, flows=10_000, faults=8, ttl=5, scan=10, rate=50)
        if arm == "kill_after_commit":
            cfg.faults = 20
        if arm == "zombie":
            # Each stop leaves two workers for a while: at 50 flows/s they fell behind (a
            # backlog, resumes of 40-140 s), which measures the queue, not recovery.
            cfg.rate = 25
        if arm == "redis_restart":
            cfg.redis_leases = True
            cfg.work_ms = (150, 300)
        if arm == "lease_store_outage":
            # Steps outlast a renewal interval (TTL/3): Redis stops under running steps,
            # which finish with no live lease. Slower feed: each flow takes ~9 s.
            cfg.redis_leases, cfg.faults, cfg.rate = True, 4, 35
            cfg.work_ms = (int(cfg.ttl * 400), int(cfg.ttl * 500))
        if arm == "clock_skew":
            cfg.skews = (cfg.ttl / 2, -cfg.ttl / 2, 0.0)
        if arm == "sigterm_drain":
            cfg.ttl = 30
        plan.append(cfg)
    return plan


#: Every arm at CI size: what ``tests/chaos`` runs (``--quick --only ARM``), one arm a test.
CI_ARMS = {
    "kill_after_effect": RigConfig(arm="kill_after_effect", flows=500, faults=3),
    "kill_after_commit": RigConfig(arm="kill_after_commit", flows=500, faults=3),
    # Each fault here lasts a TTL or more: a slower feed keeps work in flight throughout.
    "zombie": RigConfig(arm="zombie", flows=400, faults=2, rate=40),
    "kill_during_takeover": RigConfig(arm="kill_during_takeover", flows=400, faults=2, rate=40),
    "postgres_restart": RigConfig(arm="postgres_restart", flows=500, faults=1),
    # Slower steps, so instances are mid-flight when Redis goes away for a whole TTL: their
    # leases run out, they abort, and are taken again from a Redis that forgot every counter.
    "redis_restart": RigConfig(
        arm="redis_restart", flows=500, faults=2, redis_leases=True, work_ms=(150, 300)
    ),
    # A long TTL, so "resumed within one TTL" can only come from the hand-back (R7.2). A
    # slower feed, so a SIGTERM always finds instances in flight to hand back: at full speed
    # the 500 flows can all be done before the second one lands, leaving nothing to measure.
    "sigterm_drain": RigConfig(arm="sigterm_drain", flows=500, faults=2, ttl=20.0, rate=40),
    # Issue 12 item 1: a step's COMMIT runs on the server and its reply never comes back.
    "commit_no_reply": RigConfig(arm="commit_no_reply", flows=400, faults=2, rate=40),
    # Item 2: one worker's clock TTL/2 ahead, one TTL/2 behind; kills aimed at those two.
    # 1,000 flows (25 s of feed), not 400: each kill takes work from a skewed worker (its
    # in-flight instances go to a peer, its replacement starts cold), and over a 10 s run two
    # kills alone pushed a skewed worker's share under the starvation line (0.164 < 0.167,
    # measured under load) with no starvation involved.
    "clock_skew": RigConfig(
        arm="clock_skew", flows=1000, faults=2, ttl=4.0, rate=40, skews=(2.0, -2.0, 0.0)
    ),
    # Item 3: Redis leases gone for 3 x TTL while steps outlast a renewal interval.
    "lease_store_outage": RigConfig(
        arm="lease_store_outage",
        flows=300,
        faults=1,
        rate=40,
        redis_leases=True,
        work_ms=(1200, 1500),
    ),
}


def quick_plan() -> list[RigConfig]:
    return list(CI_ARMS.values())


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| arm | lease store | TTL | scan | flows | faults | lost | duplicate effects "
        "| of which cut off by a fault | writes refused | resume p50 | resume p99 | max "
        "| resumes cut by a later fault (by chance) | invariants |"
    )
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        ok = all(r["invariants"].values())
        failed = [k for k, v in r["invariants"].items() if not v]

        def s(v: Any) -> str:
            return "–" if v is None else f"{v:.2f} s" if isinstance(v, float) else str(v)

        cut = (
            f"{r['resumes_interrupted_by_a_later_fault']} of {r['resumes_total']} ({chance:.1f})"
            if (chance := r.get("interrupted_expected_by_chance")) is not None
            else str(r["resumes_interrupted_by_a_later_fault"])
        )
        lines.append(
            f"| {r['arm']} | {r['lease_store']} | {r['lease_ttl_s']:.0f} s "
            f"| {r['scan_interval_s']:.0f} s | {r['flows']:,} | {r['faults']} | {r['lost']} "
            f"| {r['duplicate_effects']} | {r['uncommitted_effects_explained']} "
            f"| {r['writes_refused']} | {s(r['resume_p50_s'])} | {s(r['resume_p99_s'])} "
            f"| {s(r['resume_max_s'])} | {cut} "
            f"| {'all hold' if ok else 'FAILED: ' + ', '.join(failed)} |"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every arm at CI size")
    parser.add_argument("--arm", choices=ARMS, default=None)
    parser.add_argument("--flows", type=int, default=2_000)
    parser.add_argument("--faults", type=int, default=5)
    parser.add_argument("--ttl", type=float, default=5.0)
    parser.add_argument("--scan", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=80.0)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "chaos.json")
    parser.add_argument(
        "--only", default=None, help="comma-separated arms: run just these of the full plan"
    )
    parser.add_argument(
        "--append", action="store_true",
        help="merge into the runs already in --out (a run of the same arm and TTL is replaced)",
    )  # fmt: skip
    parser.add_argument(
        "--note", default=None, help="what else the machine was doing, kept with the results"
    )
    parser.add_argument(
        "--reanalyse", action="store_true",
        help="run nothing: recompute the interruption measures of --out from its fault logs "
        "(benchmarks/rig/interrupts.py) and print the table",
    )  # fmt: skip
    args = parser.parse_args()
    if args.reanalyse:
        _reanalyse(args.out)
        return
    if args.arm:
        plan = [
            RigConfig(
                arm=args.arm, flows=args.flows, faults=args.faults, ttl=args.ttl,
                scan=args.scan, rate=args.rate, workers=args.workers,
                redis_leases=args.arm in ("redis_restart", "lease_store_outage"),
            )
        ]  # fmt: skip
    else:
        plan = quick_plan() if args.quick else full_plan()
    if args.only:
        # In the order given; ``arm@ttl`` picks one TTL of an arm the plan runs at several.
        plan = [cfg for want in args.only.split(",") for cfg in plan
                if want in (cfg.arm, f"{cfg.arm}@{cfg.ttl:g}")]  # fmt: skip
    rows: list[dict[str, Any]] = []
    if args.append and args.out.exists():
        # A run of an arm at a TTL replaces the earlier one; the rest are kept as they were.
        # (once it has finished: a run that dies keeps the row it was to replace).
        rows = list(json.loads(args.out.read_text())["runs"])
    with tempfile.TemporaryDirectory(prefix="flowx-chaos-") as tmp:
        for i, cfg in enumerate(plan):
            print(
                f"[{now_iso()}] {cfg.arm}: {cfg.flows} flows, {cfg.faults} faults, TTL {cfg.ttl}s"
            )
            rig = Rig(cfg, Path(tmp) / f"{i}-{cfg.arm}")
            try:
                result = await rig.run()
                trace = await rig.trace()
                result.update(interruption_model(trace, result["effects"]))
                _write_trace(args.out, cfg, trace)
            finally:
                rig.cleanup()
            result["invariants"] = invariants(result)
            result["faults_planned"] = cfg.faults  # what tests/chaos checks were all injected
            rows = [
                r for r in rows if (r["arm"], float(r["lease_ttl_s"])) != (cfg.arm, float(cfg.ttl))
            ]
            rows.append(result)  # fmt: skip
            print(table([result]).splitlines()[-1], flush=True)
            # After every arm: a long run that dies keeps what it did.
            _write(args.out, rows, args.note)
    print()
    print(table(rows))
    print(f"\nwritten to {args.out}")


def _write(out: Path, rows: list[dict[str, Any]], note: str | None) -> None:
    machine: dict[str, Any] = {"python": platform.python_version(), "cpus": _cpus()}
    if note:
        machine["note"] = note
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "chaos",
                "generated_at": now_iso(),
                "machine": machine,
                "runs": rows,
            },
            indent=2,
        )
        + "\n"
    )


def _trace_path(out: Path, arm: str, ttl: float) -> Path:
    return out.parent / "chaos-trace" / f"{arm}-ttl{ttl:g}.json"


def _reanalyse(out: Path) -> None:
    data = json.loads(out.read_text())
    for row in data["runs"]:
        path = _trace_path(out, row["arm"], row["lease_ttl_s"])
        for candidate in (path, path.with_name(path.name + ".gz")):
            if candidate.exists():
                row.update(interruption_model(load(candidate), row["effects"]))
                break
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(table(data["runs"]))


def _write_trace(out: Path, cfg: RigConfig, trace: dict[str, Any]) -> None:
    """The fault log of one arm, next to the results: what the README's analysis reads."""
    path = _trace_path(out, cfg.arm, cfg.ttl)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace, default=str) + "\n")


def _cpus() -> int | None:
    import os

    return os.cpu_count()


if __name__ == "__main__":
    asyncio.run(main())
