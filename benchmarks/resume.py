"""Resume cost: how long a node takes to pick up an instance with many committed steps.

A resumed instance is replayed: every committed row's result is decoded and applied to the
state (``into=``) before the next step runs. If applying a row re-validated the whole state,
a resume of N rows over a state of size S would cost N × S (issue 14 item 6). This measures it:

- each instance runs ``--rows`` steps that each write ``into="last"``, over a state that also
  holds ``big``, a dict of ``--state-size`` entries (set by the first step), then parks on a
  signal;
- a *fresh* host (nothing cached) is sent the signal and the clock runs until the instance
  has replayed every row and completed.

Rows × state size are crossed, so the per-row cost can be read off: if it grows with the
state size, the state is re-validated per row.

    python -m benchmarks.resume --store postgresql://postgres@127.0.0.1:5432/test
    python -m benchmarks.resume --before /path/to/older/checkout   # the same, both trees

With ``--before``, each round runs the older tree's engine (its ``src`` on ``PYTHONPATH``, in
its own process) and this tree's, alternating, and reports this/before ratios. Writes
``benchmarks/results/resume-<backend>.json`` and prints a table. It asserts nothing.
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
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import flowx
from flowx.stores.records import InstanceState

RESULTS = Path(__file__).resolve().parent / "results"
HERE = Path(__file__).resolve().parent.parent


class Job(BaseModel):
    size: int


class Go(BaseModel):
    n: int


class BigState(BaseModel):
    big: dict[str, int] = {}
    last: int | None = None
    go: Go | None = None


@flowx.capability("bench.resume.seed", version="1.0.0")
async def seed(ctx: flowx.StepContext, job: Job) -> dict[str, int]:
    return {f"k{i}": i for i in range(job.size)}


@flowx.capability("bench.resume.tick", version="1.0.0")
async def tick(ctx: flowx.StepContext, job: Job) -> int:
    return job.size


def plan_of(rows: int) -> flowx.Plan:
    builder = flowx.flow(f"bench.resume.r{rows}", version="1", input=Job, state=BigState)
    builder = builder.step(seed, name="seed", into="big")
    for i in range(rows):
        builder = builder.step(tick, name=f"t{i}", into="last")
    return builder.await_signal("go", Go, into="go").build()


async def _until(host: flowx.FlowHost, iid: str, state: InstanceState) -> None:
    assert host.store is not None
    while True:
        record = await host.store.journal.get(iid)
        if record is not None and record.state is state:
            return
        if record is not None and record.state.terminal:
            raise RuntimeError(f"{iid} ended {record.state.value}, not {state.value}")
        await asyncio.sleep(0.005)


async def measure(url: str, rows: int, size: int, repeats: int) -> list[float]:
    """Seconds from the signal to Completed, on a fresh host, ``repeats`` times."""
    plan = plan_of(rows)
    settings = flowx.HostSettings(recovery=False)
    ids: list[str] = []
    async with flowx.FlowHost(store=flowx.from_url(url), flows=[plan], settings=settings) as host:
        for _ in range(repeats):
            handle = await host.start(plan, Job(size=size))
            await _until(host, handle.instance_id, InstanceState.SUSPENDED)
            ids.append(handle.instance_id)
    out: list[float] = []
    for iid in ids:
        async with flowx.FlowHost(
            store=flowx.from_url(url), flows=[plan], settings=settings
        ) as fresh:
            started = time.perf_counter()
            await fresh.signal(iid, "go", Go(n=1))
            await _until(fresh, iid, InstanceState.COMPLETED)
            out.append(time.perf_counter() - started)
    return out


def _child(src: Path, args: list[str]) -> dict[str, Any]:
    """One measurement in a process of its own, importing FlowX from ``src``."""
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{HERE}")
    out = subprocess.run(  # our own interpreter and module
        [sys.executable, "-m", "benchmarks.resume", "--child", *args],
        env=env,
        cwd=HERE,
        check=False,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"the run with {src} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _store_for(store: str | None, tree: str) -> str:
    """A store of the tree's own: each tree migrates its schema its own way."""
    if store is None:
        return f"sqlite:///{tempfile.mkdtemp()}/resume-{tree}.db"
    mark = "&" if "?" in store else "?"
    return f"{store}{mark}flowx_schema=bench_resume_{tree}_{uuid.uuid4().hex[:6]}"


def _drop(urls: dict[str, str]) -> None:
    """The schemas this run made, gone (PostgreSQL); a SQLite file is in a temporary folder."""
    import psycopg
    from psycopg import sql

    for url in urls.values():
        if not url.startswith(("postgres://", "postgresql://")):
            continue
        base, _, schema = url.rpartition("flowx_schema=")
        with psycopg.connect(base.rstrip("?&"), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--rows", default="10,1000")
    parser.add_argument("--state-size", default="0,5000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, default=None, help="an older checkout")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    url = args.store or f"sqlite:///{tempfile.mkdtemp()}/resume-{uuid.uuid4().hex[:6]}.db"
    rows = [int(r) for r in args.rows.split(",")]
    sizes = [int(s) for s in args.state_size.split(",")]
    if args.child:
        result = {
            f"{r}x{s}": asyncio.run(measure(url, r, s, args.repeats)) for r in rows for s in sizes
        }
        print(json.dumps(result))
        return
    trees = {"this": HERE / "src"}
    if args.before is not None:
        trees = {"before": args.before.resolve() / "src", **trees}
    urls = {tree: _store_for(args.store, tree) for tree in trees}
    common = ["--rows", args.rows, "--state-size", args.state_size, "--repeats", str(args.repeats)]
    samples: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    try:
        for n in range(args.rounds):
            order = list(trees.items()) if n % 2 == 0 else list(reversed(trees.items()))
            for tree, src in order:  # alternating: the machine's noise hits both
                for key, values in _child(src, ["--store", urls[tree], *common]).items():
                    samples[tree].setdefault(key, []).extend(values)
    finally:
        _drop(urls)
    table: dict[str, Any] = {}
    print(f"{'tree':8} {'rows':>6} {'state':>6} {'resume p50 ms':>14} {'per row µs':>11}")
    for tree, by_key in samples.items():
        for r in rows:
            for s in sizes:
                p50 = statistics.median(by_key[f"{r}x{s}"]) * 1000
                base = statistics.median(by_key[f"{rows[0]}x{s}"]) * 1000
                per_row = (p50 - base) / (r - rows[0]) * 1000 if r != rows[0] else None
                table[f"{tree}:{r}x{s}"] = {"p50_ms": p50, "per_row_us": per_row}
                shown = f"{per_row:11.1f}" if per_row is not None else f"{'':>11}"
                print(f"{tree:8} {r:6} {s:6} {p50:14.1f} {shown}")
    if "before" in samples:
        for r in rows:
            for s in sizes:
                ratio = table[f"before:{r}x{s}"]["p50_ms"] / table[f"this:{r}x{s}"]["p50_ms"]
                table[f"speedup:{r}x{s}"] = ratio
                print(f"speedup (before/this) rows={r} state={s}: {ratio:.2f}×")
    RESULTS.mkdir(exist_ok=True)
    backend = url.split(":", 1)[0]
    path = RESULTS / f"resume-{backend}.json"
    meta = {"machine": platform.platform(), "cpus": os.cpu_count(), "store": backend}
    run = {"args": {"rows": rows, "state_size": sizes, "repeats": args.repeats}}
    path.write_text(json.dumps({**meta, **run, "samples": samples, "table": table}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
