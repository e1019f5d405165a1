"""FlowX against DBOS Transact, side by side: the same 3-step workflow on the same store.

The workflow is B7's (``benchmarks.journal_throughput``, ``make_plan(3)``): three steps whose
body returns its input. On the DBOS side it is one ``@DBOS.workflow()`` awaiting three
``@DBOS.step()`` calls, both ``async`` (``benchmarks/dbos_side.py``). DBOS is pinned
(``DBOS_VERSION``) and installed by this benchmark, the first time it runs, into a virtualenv
of its own, ``benchmarks/.dbos-venv``; it never enters the FlowX virtualenv, and
``dbos_side.py`` never imports ``flowx``.

Every measurement is one fresh subprocess per system, started the same way: FlowX's with this
python (``--flowx-side``), DBOS's with the DBOS virtualenv's. Each gets a fresh store: on
PostgreSQL one throwaway database ``dbos_bench_<random>`` is created for the run (dropped at the
end) and every measurement gets a new schema in it (``?flowx_schema=`` for FlowX,
``dbos_system_schema`` for DBOS); on SQLite a new file (``--store sqlite``; DBOS supports a
SQLite system database, ``system_database_url="sqlite:///..."``). Both run with their shipped
defaults otherwise (FlowX's SQLite is WAL with ``synchronous=FULL``, DBOS's is SQLite's rollback
journal). Modes:

* ``c1``: ``--c1-instances`` workflows one at a time. ``c16``, ``c64``: ``--instances``
  workflows, that many in flight, an ``asyncio.Semaphore`` on both sides: FlowX
  ``host.start`` + ``handle.result``, DBOS ``DBOS.start_workflow_async`` +
  ``handle.get_result`` (its async API runs the workflow on the caller's event loop, as FlowX
  does, rather than a thread per workflow). Reported: workflows/s, and each workflow's latency
  from its start call to its result, p50 and p99. One untimed warm-up workflow first.
* ``backlog``: ``--instances`` workflows submitted without being run (FlowX:
  ``host.start(..., run_here=False)``; DBOS: ``enqueue_async`` on a queue, from a process that
  listens to no queue), then ``--workers`` worker processes (``flowx worker``; DBOS processes
  listening to the queue) drain them, as ``benchmarks.backlog`` does. This process counts the
  finished rows every 50 ms (FlowX ``Completed``, DBOS ``SUCCESS``). flows/s is from the moment
  every worker is ready; ``idle`` is ready to the first finished row (DBOS's queue is polled,
  every ``--dbos-poll`` s, its default 1 s), ``after 1st/s`` the rate from there. The DBOS
  queue has no ``worker_concurrency`` unless ``--dbos-worker-concurrency``: its first poll then
  takes the whole backlog, so with several workers one of them does all the work.

Rounds (``--rounds``) interleave everything: each round runs every mode, the mode order rotated
and the system order alternated round by round. The table shows medians over rounds and the
FlowX/DBOS ratios: throughput above 1 and latency below 1 favour FlowX.

    python -m benchmarks.dbos_compare --store postgresql://postgres@127.0.0.1:5432/test
    python -m benchmarks.dbos_compare --store sqlite
    python -m benchmarks.dbos_compare --store sqlite --quick      # a smoke run: small, 1 round

Writes ``benchmarks/results/dbos-<backend>.json`` (or ``--out``) and prints a table. It asserts
nothing.
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
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

import flowx
from benchmarks.backlog import drain
from benchmarks.journal_throughput import Job, make_plan

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
VENV = ROOT / "benchmarks" / ".dbos-venv"
SIDE = ROOT / "benchmarks" / "dbos_side.py"
DBOS_VERSION = "3.4.0"
PLAN = make_plan(3)
FLOWS = [PLAN]
SYSTEMS = ("flowx", "dbos")
MODES = ("c1", "c16", "c64", "backlog")
SUBMIT_CHUNK = 64
POLL = 0.05
WITHIN = 600.0  # seconds one measurement may take before the run is abandoned


# --- the FlowX side: run in a subprocess of its own, as the DBOS side is -----------------------


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _host(url: str) -> flowx.FlowHost:
    settings = flowx.HostSettings.load(recovery=False, timers=False)
    return flowx.FlowHost(store=flowx.from_url(url), flows=FLOWS, settings=settings)


async def _flowx_run(url: str, concurrency: int, instances: int) -> dict[str, Any]:
    async with _host(url) as host:
        gate = asyncio.Semaphore(concurrency)
        latencies: list[float] = []

        async def one(n: int) -> None:
            async with gate:
                began = time.perf_counter()
                handle = await host.start(PLAN, Job(n=n))
                await handle.result(poll=0.001)
                latencies.append(time.perf_counter() - began)

        await one(-1)  # warm-up: schema, statement cache, first connection
        latencies.clear()
        started = time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(instances)))
        elapsed = time.perf_counter() - started
    return {
        "elapsed_s": elapsed,
        "flows_per_s": instances / elapsed,
        "p50_ms": _percentile(latencies, 0.50) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
    }


async def _flowx_submit(url: str, instances: int) -> dict[str, Any]:
    async with _host(url) as host:
        started = time.perf_counter()
        for first in range(0, instances, SUBMIT_CHUNK):
            chunk = range(first, min(instances, first + SUBMIT_CHUNK))
            await asyncio.gather(*(host.start(PLAN, Job(n=i), run_here=False) for i in chunk))
        elapsed = time.perf_counter() - started
    return {"submit_s": elapsed}


def _flowx_side(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="dbos_compare --flowx-side")
    parser.add_argument("command", choices=["run", "submit"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--instances", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args(argv)
    if args.command == "run":
        out = asyncio.run(_flowx_run(args.url, args.concurrency, args.instances))
    else:
        out = asyncio.run(_flowx_submit(args.url, args.instances))
    print(json.dumps(out), flush=True)


# --- the DBOS virtualenv ------------------------------------------------------------------------


def _dbos_python() -> Path:
    """The DBOS virtualenv's python, the virtualenv made and DBOS installed the first time."""
    python = VENV / "bin" / "python"
    if python.exists():
        # As Python 3.13's venv does: the virtualenv stays out of git whatever .gitignore says.
        (VENV / ".gitignore").write_text("*\n")
        probe = "import importlib.metadata as m; print(m.version('dbos'))"
        got = subprocess.run([python, "-c", probe], capture_output=True, text=True)
        if got.returncode == 0 and got.stdout.strip() == DBOS_VERSION:
            return python
    else:
        print(f"creating {VENV} for DBOS {DBOS_VERSION}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        (VENV / ".gitignore").write_text("*\n")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, f"dbos=={DBOS_VERSION}"], check=True)
    return python


# --- stores -------------------------------------------------------------------------------------


class Stores:
    """Where each measurement runs: a fresh schema of one throwaway PostgreSQL database, or a
    fresh SQLite file. ``fresh`` gives the URL, the DBOS schema (or None), a count of finished
    workflows, and how to get rid of the store."""

    def __init__(self, store: str, folder: Path) -> None:
        self.backend = "sqlite" if store.startswith("sqlite") else "postgresql"
        self.folder = folder
        self.server = store
        self.database = f"dbos_bench_{uuid.uuid4().hex[:8]}"
        self.db_url = ""
        if self.backend == "postgresql":
            parts = urlsplit(store)
            self.db_url = urlunsplit(parts._replace(path=f"/{self.database}", query=""))
            self._admin(f'CREATE DATABASE "{self.database}"')

    def _admin(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.server, autocommit=True) as conn:
            conn.execute(statement.encode())

    def server_version(self) -> str:
        if self.backend == "sqlite":
            return f"SQLite {sqlite3.sqlite_version}"
        import psycopg

        with psycopg.connect(self.db_url) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return f"PostgreSQL {row[0] if row else '?'}"

    def fresh(self, system: str) -> tuple[str, str | None, Callable[[], int], Callable[[], None]]:
        tag = f"{system}_{uuid.uuid4().hex[:8]}"
        table, done = {
            "flowx": ("flow_instance", "state = 'Completed'"),
            "dbos": ("workflow_status", "status = 'SUCCESS'"),
        }[system]
        if self.backend == "sqlite":
            path = self.folder / f"{tag}.db"
            lite: list[sqlite3.Connection] = []

            def count_lite() -> int:
                if not lite:  # read-only, and only once the submitter has created the file
                    lite.append(sqlite3.connect(f"file:{path}?mode=ro", uri=True))
                return int(lite[0].execute(f"SELECT count(*) FROM {table} WHERE {done}")
                           .fetchone()[0])  # fmt: skip

            def close_lite() -> None:
                for conn in lite:
                    conn.close()

            return f"sqlite:///{path}", None, count_lite, close_lite
        import psycopg

        pg: list[psycopg.Connection[Any]] = []
        query = f'SELECT count(*) FROM "{tag}".{table} WHERE {done}'

        def count_pg() -> int:
            if not pg:
                pg.append(psycopg.connect(self.db_url, autocommit=True))
            row = pg[0].execute(query.encode()).fetchone()
            return int(row[0]) if row else 0

        def drop_pg() -> None:
            for conn in pg:
                conn.close()
            with psycopg.connect(self.db_url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{tag}" CASCADE'.encode())

        if system == "flowx":
            return f"{self.db_url}?flowx_schema={tag}", None, count_pg, drop_pg
        return self.db_url, tag, count_pg, drop_pg

    def close(self) -> None:
        if self.backend == "postgresql":
            self._admin(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')


# --- one measurement ------------------------------------------------------------------------------


class Sides:
    """How to start each system's subprocesses."""

    def __init__(self, dbos_python: Path, args: argparse.Namespace) -> None:
        self.dbos_python = dbos_python
        self.args = args
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}

    def command(self, system: str, what: str, url: str, schema: str | None) -> list[str]:
        if system == "flowx":
            return [sys.executable, "-m", "benchmarks.dbos_compare", "--flowx-side", what,
                    "--url", url]  # fmt: skip
        extra = ["--schema", schema] if schema else []
        if what == "submit":
            extra += ["--poll", str(self.args.dbos_poll)]
            if self.args.dbos_worker_concurrency is not None:
                extra += ["--worker-concurrency", str(self.args.dbos_worker_concurrency)]
        return [str(self.dbos_python), str(SIDE), what, "--url", url, *extra]

    def child(self, command: list[str]) -> dict[str, Any]:
        got = subprocess.run(command, cwd=ROOT, env=self.env, capture_output=True, text=True,
                             timeout=WITHIN)  # fmt: skip
        if got.returncode != 0:
            tail = got.stderr.strip().splitlines()[-15:]
            raise RuntimeError(f"{command[:4]} exited {got.returncode}: " + "\n".join(tail))
        return dict(json.loads(got.stdout.strip().splitlines()[-1]))

    def worker(
        self, system: str, url: str, schema: str | None, ready: Path, log: IO[bytes]
    ) -> subprocess.Popen[bytes]:
        # stderr to a file, not a pipe: a chatty worker must never block on a full pipe.
        if system == "flowx":
            command = [sys.executable, "-m", "flowx.cli.main", "worker", "--db", url,
                       "--flows", "benchmarks.dbos_compare:FLOWS", "--ready-file", str(ready),
                       "--log-level", "warning"]  # fmt: skip
        else:
            command = [*self.command(system, "worker", url, schema), "--ready-file", str(ready)]
        return subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL,
                                stderr=log)  # fmt: skip


def _drain(
    sides: Sides, system: str, url: str, schema: str | None, count: Callable[[], int], n: int
) -> dict[str, Any]:
    k = sides.args.workers
    folder = Path(tempfile.mkdtemp(prefix="dbos-compare-"))
    readies = [folder / f"ready-{w}" for w in range(k)]
    paths = [folder / f"worker-{w}.log" for w in range(k)]
    logs = [path.open("wb") for path in paths]
    launched = time.perf_counter()
    procs = [
        sides.worker(system, url, schema, r, log) for r, log in zip(readies, logs, strict=True)
    ]
    return drain(procs, logs, readies, paths, count, n, f"{system} backlog", launched)


def measure(sides: Sides, stores: Stores, system: str, mode: str) -> dict[str, Any]:
    args = sides.args
    url, schema, count, drop = stores.fresh(system)
    began = time.perf_counter()
    try:
        if mode == "backlog":
            n = args.instances
            command = sides.command(system, "submit", url, schema)
            got = sides.child([*command, "--instances", str(n)])
            got |= _drain(sides, system, url, schema, count, n)
        else:
            c = int(mode.removeprefix("c"))
            n = args.c1_instances if c == 1 else args.instances
            command = sides.command(system, "run", url, schema)
            got = sides.child([*command, "--instances", str(n), "--concurrency", str(c)])
    finally:
        drop()
    got["instances"] = n
    got["wall_s"] = time.perf_counter() - began  # start-up and store set-up included
    return {key: round(v, 3) if isinstance(v, float) else v for key, v in got.items()}


# --- the run ------------------------------------------------------------------------------------


def summarise(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Medians over rounds per mode and system, and the FlowX/DBOS ratios."""
    out: dict[str, Any] = {}
    for mode, by_system in runs.items():
        keys = ["flows_per_s", "p50_ms", "p99_ms"]
        if mode == "backlog":
            keys = ["flows_per_s", "after_first_flows_per_s", "idle_s", "startup_s", "submit_s"]
        medians = {
            system: {k: round(statistics.median(r[k] for r in seen), 3) for k in keys}
            for system, seen in by_system.items()
        }
        ratios = {
            k: round(medians["flowx"][k] / medians["dbos"][k], 2)
            for k in keys
            if k in ("flows_per_s", "p50_ms", "p99_ms", "after_first_flows_per_s")
            and medians["dbos"][k]
        }
        out[mode] = {"median": medians, "flowx_over_dbos": ratios}
    return out


def _print_table(summary: dict[str, Any], runs: dict[str, Any], head: str) -> None:
    print(f"\n{head}")
    print(f"{'mode':<8} {'system':<6} {'flows/s':>9} {'p50 ms':>8} {'p99 ms':>8}  per round")
    for mode, row in summary.items():
        for system in SYSTEMS:
            m = row["median"][system]
            per = ", ".join(f"{r['flows_per_s']:.0f}" for r in runs[mode][system])
            if mode == "backlog":
                lat = f"{'-':>8} {'-':>8}"
                per += (f"  (idle {m['idle_s']:.2f} s, after 1st {m['after_first_flows_per_s']:.0f}"
                        f"/s, start-up {m['startup_s']:.2f} s)")  # fmt: skip
            else:
                lat = f"{m['p50_ms']:>8.2f} {m['p99_ms']:>8.2f}"
            print(f"{mode:<8} {system:<6} {m['flows_per_s']:>9.1f} {lat}  {per}")
    print("\nFlowX/DBOS (throughput: above 1 favours FlowX; latency: below 1 favours FlowX)")
    for mode, row in summary.items():
        ratios = ", ".join(f"{k} {v}" for k, v in row["flowx_over_dbos"].items())
        print(f"{mode:<8} {ratios}")


def _commit() -> str | None:
    got = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return got.stdout.strip() or None


def main() -> None:
    if sys.argv[1:2] == ["--flowx-side"]:
        _flowx_side(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="sqlite", help="a PostgreSQL URL, or sqlite")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--c1-instances", type=int, default=200)
    parser.add_argument("--instances", type=int, default=2000, help="c16, c64 and backlog")
    parser.add_argument("--workers", type=int, default=1, help="worker processes, backlog")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dbos-poll", type=float, default=1.0, help="DBOS queue polling, s")
    parser.add_argument("--dbos-worker-concurrency", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="20 + 100 instances, 1 round")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.c1_instances, args.instances, args.rounds = 20, 100, 1
    modes = [m for m in args.modes.split(",") if m]
    dbos_python = _dbos_python()
    sides = Sides(dbos_python, args)
    versions = sides.child([str(dbos_python), str(SIDE), "version"])
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {m: {s: [] for s in SYSTEMS} for m in modes}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        stores = Stores(args.store, Path(tmp))
        try:
            server = stores.server_version()
            for r in range(args.rounds):
                shift = r % len(modes)
                systems = SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]
                for mode in modes[shift:] + modes[:shift]:
                    for system in systems:
                        got = measure(sides, stores, system, mode)
                        runs[mode][system].append(got)
                        print(f"round {r + 1}/{args.rounds} {mode} {system}: "
                              f"{got['flows_per_s']:.0f} flows/s", file=sys.stderr)  # fmt: skip
        finally:
            stores.close()
    backend = stores.backend
    summary = summarise(runs)
    result: dict[str, Any] = {
        "benchmark": "dbos side by side",
        "backend": backend,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "server": server,
        },
        "flowx_commit": _commit(),
        "dbos_version": versions["dbos"],
        "dbos_python": versions["python"],
        "steps_per_workflow": len(PLAN.body),
        "c1_instances": args.c1_instances,
        "instances": args.instances,
        "workers": args.workers,
        "rounds": args.rounds,
        "dbos_queue": {
            "polling_interval_sec": args.dbos_poll,
            "worker_concurrency": args.dbos_worker_concurrency,
        },
        "run_s": round(time.perf_counter() - started, 1),
        "summary": summary,
        "runs": runs,
    }
    out = args.out or RESULTS / f"dbos-{backend}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    head = (f"FlowX vs DBOS {versions['dbos']} on {server}, {len(PLAN.body)} steps, "
            f"c1 {args.c1_instances} / others {args.instances} workflows, "
            f"{args.workers} worker(s), medians of {args.rounds} round(s)")  # fmt: skip
    _print_table(summary, runs, head)
    print(f"-> {out}  ({result['run_s']} s)")


if __name__ == "__main__":
    main()
