"""Backlog: how fast 1, 2 and 4 ``flowx worker`` processes drain submitted work, against one host.

The flow is B7's (``benchmarks.journal_throughput``): three steps whose capability does
nothing, so what is measured is the runtime's own cost per instance. Every mode drains
``--instances`` instances on a fresh store (a new SQLite file, or a new PostgreSQL schema).
With ``--step-ms M`` each step instead awaits M milliseconds, as a step calling another
service does: the drain is then bound by the workers' flow slots rather than by this
machine's CPU, which is what shows whether workers add up (with ``--slots``, each worker's flow
slots, set so that one worker cannot take the whole backlog at once). Each run also records how
busy the machine's CPUs were while it drained (``cpu_busy``, from ``/proc/stat``: 1.0 is every
core busy), which says when a mode was bound by the CPU rather than by the runtime:

* ``inprocess``: one ``FlowHost`` in this process starts them with ``run_here=True``, at most
  64 in flight (fewer if ``--slots`` says so: its host takes the same setting), and waits
  for each to complete. Timed from the first start to the last end.
* ``workers=K``: a host here that only starts (no recovery, no timers) submits them with
  ``run_here=False`` (untimed; they are left ``Pending``), then K worker processes start.
  Timed from the moment the workers are launched (``total``, start-up included) and from the
  moment every worker's ``--ready-file`` exists (``ready``) until this process, counting
  ``Completed`` rows every 50 ms with a plain driver, sees all of them. flows/s uses ``ready``;
  ``idle`` is ready to the first Completed row, ``after 1st/s`` the rate from there on.

Modes are interleaved round by round, the order rotated each round so none always goes first.

    python -m benchmarks.backlog                       # SQLite in a temporary folder
    python -m benchmarks.backlog --store postgresql://postgres@127.0.0.1:5432/test

Writes ``benchmarks/results/backlog-<backend>.json`` and prints a table. It asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import flowx
from benchmarks.journal_throughput import Job, JobState, make_plan

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: How long each step waits (``--step-ms``); the worker processes read it from here too.
STEP_MS_ENV = "FLOWX_BENCH_STEP_MS"


@flowx.capability("bench.remote", version="1.0.0")
async def remote(ctx: flowx.StepContext, job: Job) -> int:
    """A step that waits on another service: it costs the runtime nothing while it waits."""
    await asyncio.sleep(float(os.environ.get(STEP_MS_ENV, "0")) / 1000)
    return job.n


def _plan() -> flowx.Plan:
    if float(os.environ.get(STEP_MS_ENV, "0")) <= 0:
        return make_plan(3)
    builder = flowx.flow("bench.remote", version="1.0.0", input=Job, state=JobState)
    for i in range(3):
        builder.step(remote, name=f"s{i}", into="last")
    return builder.build()


PLAN = _plan()
FLOWS = [PLAN]
IN_FLIGHT = 64
POLL = 0.05
WITHIN = 600.0  # seconds a drain may take before the round is abandoned


def _worker(url: str, ready: Path, log: IO[bytes]) -> subprocess.Popen[bytes]:
    # stderr to a file, not a pipe: a chatty worker must never block on a full pipe mid-drain.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.Popen(
        [sys.executable, "-m", "flowx.cli.main", "worker", "--db", url,
         "--flows", "benchmarks.backlog:FLOWS", "--ready-file", str(ready),
         "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip


def _fresh(store: str | None, folder: Path) -> tuple[str, Callable[[], int], Callable[[], None]]:
    """A new store: its URL, a cheap count of its Completed rows, and how to get rid of it."""
    query = "SELECT count(*) FROM {}flow_instance WHERE state = 'Completed'"
    if store is None:
        path = folder / f"backlog-{uuid.uuid4().hex[:8]}.db"
        lite: list[sqlite3.Connection] = []

        def count_lite() -> int:
            if not lite:  # read-only, and only once the host has created the file
                lite.append(sqlite3.connect(f"file:{path}?mode=ro", uri=True))
            return int(lite[0].execute(query.format("")).fetchone()[0])

        def close_lite() -> None:
            for conn in lite:
                conn.close()

        return f"sqlite:///{path}", count_lite, close_lite
    import psycopg

    schema = f"bench_backlog_{uuid.uuid4().hex[:8]}"
    sep = "&" if "?" in store else "?"
    pg: list[psycopg.Connection[Any]] = []

    def count_pg() -> int:
        if not pg:
            pg.append(psycopg.connect(store, autocommit=True))
        row = pg[0].execute(query.format(f'"{schema}".').encode()).fetchone()
        return int(row[0]) if row else 0

    def drop_pg() -> None:
        for conn in pg:
            conn.close()
        _drop_schema(store, schema)

    return f"{store}{sep}flowx_schema={schema}", count_pg, drop_pg


def _drop_schema(dsn: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _cpu_ticks() -> tuple[int, int]:
    """The machine's busy and total CPU ticks so far (``/proc/stat``); (0, 0) where there is
    none. Busy is everything but idle and iowait."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    total = sum(fields[:8])  # guest time is already counted in user
    return total - fields[3] - fields[4], total


def _busy(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    ticks = after[1] - before[1]
    return round((after[0] - before[0]) / ticks, 3) if ticks > 0 else None


def _lines(paths: list[Path]) -> list[list[str]]:
    return [path.read_text().splitlines() for path in paths]


def _host(url: str) -> flowx.FlowHost:
    settings = flowx.HostSettings.load(recovery=False, timers=False)
    return flowx.FlowHost(store=flowx.from_url(url), flows=FLOWS, settings=settings)


async def _inprocess(url: str, n: int) -> dict[str, float]:
    async with _host(url) as host:
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def one(i: int) -> None:
            async with gate:
                handle = await host.start(PLAN, Job(n=i), run_here=True)
                await handle.result(poll=POLL)

        started, cpu = time.perf_counter(), _cpu_ticks()
        await asyncio.gather(*(one(i) for i in range(n)))
        elapsed = time.perf_counter() - started
        busy = _busy(cpu, _cpu_ticks())
    return {"elapsed_s": elapsed, "flows_per_s": n / elapsed, "cpu_busy": busy}


async def _workers(
    url: str, count: Callable[[], int], n: int, k: int, folder: Path
) -> dict[str, Any]:
    async with _host(url) as host:
        for first in range(0, n, IN_FLIGHT):
            chunk = range(first, min(n, first + IN_FLIGHT))
            await asyncio.gather(*(host.start(PLAN, Job(n=i), run_here=False) for i in chunk))
    tag = uuid.uuid4().hex[:6]
    readies = [folder / f"ready-{tag}-{w}" for w in range(k)]
    paths = [folder / f"worker-{tag}-{w}.log" for w in range(k)]
    logs = [path.open("wb") for path in paths]
    launched = time.perf_counter()
    procs = [_worker(url, ready, log) for ready, log in zip(readies, logs, strict=True)]
    return drain(procs, logs, readies, paths, count, n, f"workers={k}", launched)


def drain(
    procs: list[subprocess.Popen[bytes]],
    logs: Sequence[IO[bytes]],
    readies: list[Path],
    paths: list[Path],
    count: Callable[[], int],
    n: int,
    label: str,
    launched: float,
) -> dict[str, Any]:
    """Watch worker processes drain ``n`` queued instances (``count()`` says how many are
    done), then stop them; the timings. Shared with ``dbos_compare.py``. Nothing else runs
    meanwhile, so it polls synchronously."""
    ready_at: float | None = None
    first_at: float | None = None
    cpu = (0, 0)
    done = 0
    try:
        while done < n:
            now = time.perf_counter()
            if now - launched > WITHIN or any(proc.poll() is not None for proc in procs):
                codes = [proc.poll() for proc in procs]
                tail = [line for lines in _lines(paths) for line in lines[-5:]]
                raise RuntimeError(f"{label}: {done}/{n} done after {now - launched:.0f}"
                                   f" s, exit codes {codes}, stderr tail {tail}")  # fmt: skip
            if ready_at is None and all(r.exists() for r in readies):
                ready_at, cpu = now, _cpu_ticks()
            done = count()
            if done and first_at is None:
                first_at = time.perf_counter()
            if done < n:
                time.sleep(POLL if ready_at is not None else 0.005)
        finished = time.perf_counter()
        busy = _busy(cpu, _cpu_ticks()) if cpu != (0, 0) else None
    finally:
        for proc in procs:
            proc.terminate()
        codes = [proc.wait(timeout=60) for proc in procs]
        for log in logs:
            log.close()
    first_at = finished if first_at is None else first_at
    # All drained before the last worker was ready (only with a tiny backlog): no wait left.
    ready_at = finished if ready_at is None else ready_at
    stderr = _lines(paths)
    return {
        "elapsed_s": finished - ready_at,
        "flows_per_s": n / max(finished - ready_at, POLL),
        "total_s": finished - launched,
        "startup_s": ready_at - launched,
        "idle_s": max(first_at - ready_at, 0.0),  # ready, and not one instance done
        "after_first_flows_per_s": n / max(finished - first_at, POLL),
        "cpu_busy": busy,
        "exit_codes": codes,
        "stderr_lines": sum(len(lines) for lines in stderr),
        "stderr_tail": [line for lines in stderr for line in lines[-3:]],
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=None, help="a PostgreSQL URL (default: SQLite)")
    parser.add_argument("--instances", type=int, default=5000)
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--step-ms", type=float, default=0.0,
        help="each step waits this long, as a call to another service would (default: none)",
    )  # fmt: skip
    parser.add_argument(
        "--slots", type=int, default=None,
        help="each worker's flow slots (FLOWX_MAX_CONCURRENT_FLOWS; default: the worker's own)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.slots is not None:  # inherited by every worker process
        os.environ["FLOWX_MAX_CONCURRENT_FLOWS"] = str(args.slots)
    if args.step_ms > 0:  # the worker processes inherit it, and build the same plan
        os.environ[STEP_MS_ENV] = str(args.step_ms)
        global PLAN, FLOWS
        PLAN = _plan()
        FLOWS = [PLAN]
    backend = "sqlite" if args.store is None else "postgresql"
    counts = [int(k) for k in args.workers.split(",")]
    modes = ["inprocess", *(f"workers={k}" for k in counts)]
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            shift = r % len(modes)
            for mode in modes[shift:] + modes[:shift]:
                url, count, drop = _fresh(args.store, Path(tmp))
                try:
                    if mode == "inprocess":
                        got = await _inprocess(url, args.instances)
                    else:
                        k = int(mode.removeprefix("workers="))
                        got = await _workers(url, count, args.instances, k, Path(tmp))
                finally:
                    drop()
                runs[mode].append({key: round(v, 3) if isinstance(v, float) else v
                                   for key, v in got.items()})  # fmt: skip
                print(f"round {r + 1}/{args.rounds} {mode}: {got['flows_per_s']:.0f} flows/s",
                      file=sys.stderr)  # fmt: skip
    median = {m: round(statistics.median(x["flows_per_s"] for x in v), 1) for m, v in runs.items()}
    bases = ["inprocess", *(["workers=1"] if 1 in counts else [])]
    ratios = {
        f"workers={k}/{base}": round(median[f"workers={k}"] / median[base], 2)
        for k in counts
        for base in bases
        if f"workers={k}" != base
    }
    result: dict[str, Any] = {
        "benchmark": "backlog",
        "backend": backend,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "instances": args.instances,
        "steps_per_instance": len(PLAN.body),
        "step_ms": args.step_ms,
        "worker_slots": args.slots,
        "rounds": args.rounds,
        "inprocess_in_flight": IN_FLIGHT,
        "median_flows_per_s": median,
        "ratios": ratios,
        "runs": runs,
    }
    suffix = f"-step{args.step_ms:g}ms" if args.step_ms > 0 else ""
    out = args.out or RESULTS / f"backlog-{backend}{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    steps = len(PLAN.body)
    print(f"\ndraining {args.instances} instances x {steps} steps of {args.step_ms:g} ms, "
          f"{backend}, {args.rounds} rounds")  # fmt: skip
    print(f"{'mode':<10} {'flows/s':>8}  {'per round':<16} {'start-up s':>10} {'idle s':>7} "
          f"{'total s':>8} {'after 1st/s':>11} {'cpu busy':>8}")  # fmt: skip
    for mode, seen in runs.items():
        per = ", ".join(f"{x['flows_per_s']:.0f}" for x in seen)
        row = [statistics.median(x.get(c, 0.0) for x in seen) for c in ("startup_s", "idle_s")]
        total = statistics.median(x.get("total_s", x["elapsed_s"]) for x in seen)
        after = statistics.median(x.get("after_first_flows_per_s", x["flows_per_s"]) for x in seen)
        loads = [x["cpu_busy"] for x in seen if x.get("cpu_busy") is not None]
        busy = f"{statistics.median(loads):.0%}" if loads else "-"
        print(f"{mode:<10} {median[mode]:>8}  {per:<16} {row[0]:>10.2f} {row[1]:>7.2f} "
              f"{total:>8.2f} {after:>11.0f} {busy:>8}")  # fmt: skip
    print(f"ratios: {ratios}  -> {out}")


if __name__ == "__main__":
    asyncio.run(main())
