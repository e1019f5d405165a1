"""``make demo``: crash a worker mid-flight and watch another one finish its work.

1. A node process starts 50 order flows on the embedded SQLite journal and runs them.
2. Once it is well into them, the demo SIGKILLs it: no drain, no release, no goodbye.
3. A second process, ``flowx worker``, finds the abandoned instances with its recovery scan
   (lease TTL 2 s here) and finishes each from its last commit.
4. The demo reads the journal and the effect ledger and prints what happened. It exits 0 only
   if every instance completed and no step ran twice except where the kill fell between an
   effect and its commit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _flowx_command() -> list[str]:
    script = Path(sys.executable).parent / "flowx"
    return [str(script)] if script.exists() else [sys.executable, "-m", "flowx.cli.main"]


async def _node(db: str, count: int) -> None:
    """Phase 1: one process that starts ``count`` orders and runs them until it is killed."""
    import flowx
    from examples.order_flow import FLOWS, Order, place_order

    settings = flowx.HostSettings.load()
    async with flowx.FlowHost(store=flowx.from_url(db), flows=FLOWS, settings=settings) as host:
        for n in range(1, count + 1):
            await host.start(
                place_order,
                Order(order_id=f"{n:03d}", amount_cents=100 * n),
                idempotency_key=f"order-{n:03d}",
            )
            await asyncio.sleep(0.01)  # orders arrive over time, not all in one instant
        print(f"node {os.getpid()}: started {count} orders", flush=True)
        await asyncio.Event().wait()  # until SIGKILL


def _query(path: Path, sql: str, *args: object) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path, timeout=30)  # read-only use; may need to recover the WAL
    try:
        return list(conn.execute(sql, args))
    finally:
        conn.close()


def _count(path: Path, sql: str, *args: object) -> int:
    if not path.exists():
        return 0
    rows = _query(path, sql, *args)
    return int(rows[0][0] or 0) if rows else 0


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise SystemExit(f"demo: timed out after {timeout:.0f}s waiting for {what}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--dir", default=str(ROOT / ".demo"))
    sub = parser.add_subparsers(dest="cmd")
    node = sub.add_parser("node")
    node.add_argument("--db", required=True)
    args = parser.parse_args()
    if args.cmd == "node":
        asyncio.run(_node(args.db, args.count))
        return 0

    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    journal, ledger = work / "flowx.db", work / "ledger.db"
    db_url = f"sqlite:///{journal}"
    env = {
        **os.environ,
        "FLOWX_DEMO_LEDGER": str(ledger),
        "FLOWX_LEASE_TTL": "2s",
        "FLOWX_RECOVERY_SCAN_INTERVAL": "500ms",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    total = args.count
    print(f"FlowX demo: {total} order flows on {db_url}")

    began = time.monotonic()
    victim = subprocess.Popen(
        [sys.executable, "-m", "examples.demo", "--count", str(total), "node", "--db", db_url],
        cwd=ROOT,
        env=env,
    )
    # Kill once every order has been started, while the later ones are still in flight.
    _wait(
        lambda: _count(journal, "SELECT count(*) FROM flow_instance") == total,
        60,
        "the first node to start every order",
    )
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_at = datetime.now(UTC)
    kill_mono = time.monotonic()
    done_q = "SELECT count(*) FROM flow_instance WHERE state = 'Completed'"
    completed_before = _count(journal, done_q)
    print(f"  SIGKILLed node {victim.pid} with {completed_before}/{total} completed")

    worker = subprocess.Popen(
        [
            *_flowx_command(),
            "worker",
            "--db",
            db_url,
            "--flows",
            "examples.order_flow:FLOWS",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        _wait(lambda: _count(journal, done_q) == total, 60, "every instance to complete")
        all_done = time.monotonic() - kill_mono
    finally:
        worker.send_signal(signal.SIGTERM)
        worker_rc = worker.wait(timeout=30)

    # -- what happened, read from the journal and the ledger --------------------------------
    completed = _count(journal, done_q)
    states = _query(journal, "SELECT state, count(*) FROM flow_instance GROUP BY state")
    effects = _query(
        ledger, "SELECT instance_id, step, count(*) FROM ledger GROUP BY instance_id, step"
    )
    re_executed = sum(int(n) - 1 for _, _, n in effects if int(n) > 1)  # type: ignore[call-overload]
    success_rows = _count(
        journal,
        "SELECT count(*) FROM flow_step WHERE outcome = 'Success' AND capability_id IS NOT NULL",
    )
    ledger_rows = sum(int(n) for _, _, n in effects)  # type: ignore[call-overload]
    resumed = _query(
        journal,
        "SELECT instance_id, min(committed_at) FROM flow_step WHERE committed_at > ? "
        "GROUP BY instance_id",
        killed_at.isoformat(timespec="microseconds"),
    )
    waits = sorted(
        (datetime.fromisoformat(str(at)) - killed_at).total_seconds() for _, at in resumed
    )
    p50 = statistics.median(waits) if waits else 0.0

    rows = [
        ("flows started", f"{total}"),
        ("completed before the kill", f"{completed_before}"),
        ("in flight when SIGKILLed", f"{total - completed_before}"),
        ("completed in the end", f"{completed}"),
        ("lost", f"{total - completed}"),
        ("steps re-executed (kill between effect and commit)", f"{re_executed}"),
        ("effects in the ledger / steps committed", f"{ledger_rows} / {success_rows}"),
        ("resume: kill -> next commit, p50 / max", f"{p50:.2f} s / {max(waits or [0]):.2f} s"),
        ("resume: kill -> all completed", f"{all_done:.2f} s  (lease TTL 2 s)"),
        ("second worker exit code after SIGTERM", f"{worker_rc}"),
        ("demo wall time", f"{time.monotonic() - began:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    print(f"  {'':{width}}  result")
    for key, value in rows:
        print(f"  {key:{width}}  {value}")
    print(f"  states: {', '.join(f'{s}={n}' for s, n in states)}")
    in_flight = total - completed_before
    per_instance: dict[object, int] = {}
    for instance_id, _, n in effects:
        per_instance[instance_id] = per_instance.get(instance_id, 0) + int(n) - 1  # type: ignore[call-overload]
    # One step per instance is in flight at a time, so one kill re-executes at most one.
    ok = (
        completed == total
        and worker_rc == 0
        and re_executed <= in_flight
        and max(per_instance.values(), default=0) <= 1
    )
    print()
    print("  OK: every instance completed" if ok else "  FAILED: see the table above")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
