"""The retention sweep on PostgreSQL: how fast it deletes, and what it costs live work.

A fresh schema gets ``--instances`` Completed instances that ended 60 days ago (each with one
step row, made with ``generate_series``), and ``--writers`` live instances. Each writer commits
steps to its own live instance in a loop through the real store (``journal.commit``),
recording every commit's latency. The run has two phases, back to back, on one database:

* ``baseline``: the writers alone, for ``--baseline`` seconds;
* ``sweep``: the writers while one sweep (``flowx.hosting.retention.sweep``, no archiver,
  ``--page`` instances a page) deletes every expired instance.

    python -m benchmarks.retention --store postgresql://postgres@127.0.0.1:5432/test

Prints a table and writes ``benchmarks/results/retention-postgresql.json``: instances deleted
per second, and the writers' commit latency (p50, p99, worst) in each phase — the worst is
the longest any step commit waited while the sweep ran, lock waits included. A benchmark, not
a test: it asserts nothing but that the sweep deleted every expired instance.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
import uuid
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg

from flowx.hosting.retention import sweep
from flowx.stores.postgres import PostgresStores
from flowx.stores.records import NewInstance, StepCommit, StepWrite
from flowx.stores.records import Outcome as StepOutcome

RESULTS = Path(__file__).parent / "results"


def _populate(dsn: str, schema: str, count: int) -> float:
    """``count`` ended instances, 60 days old, one step row each; seconds it took."""
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute(
            """
            INSERT INTO flow_instance (instance_id, flow_id, flow_version, state, fence,
                                       next_sequence, input, state_bag, created_at, updated_at)
            SELECT gen_random_uuid(), 'bench.old', '1', 'Completed', 1, 2, '{"n":1}', '{}',
                   now() - interval '61 days', now() - interval '60 days' + make_interval(secs => n)
              FROM generate_series(1, %(n)s) AS n
            """,
            {"n": count},
        )
        conn.execute(
            """
            INSERT INTO flow_step (instance_id, scope, step_id, attempt, sequence, step_name,
                                   outcome, result, capability_id, capability_version,
                                   duration_ms, committed_at)
            SELECT instance_id, '', 1, 1, 1, 'old', 'Success', '"ok"', 'cap', '1', 1, updated_at
              FROM flow_instance WHERE flow_id = 'bench.old'
            """
        )
        conn.execute("ANALYZE")
    return time.perf_counter() - started


async def _writer(
    stores: PostgresStores,
    iid: str,
    stop: asyncio.Event,
    phase: list[str],
    lat: dict[str, list[float]],
) -> None:
    step = 0
    while not stop.is_set():
        step += 1
        commit = StepCommit(
            instance_id=iid,
            token=1,
            now=None,
            step=StepWrite(
                scope="",
                step_id=step,
                attempt=1,
                step_name=f"s{step}",
                outcome=StepOutcome.SUCCESS,
                result=str(step),
                capability_id="bench.cap",
                capability_version="1",
                nondeterministic=None,
                duration_ms=0,
            ),
            state_bag=json.dumps({"step": step}),
        )
        sent = time.perf_counter()
        await stores.journal.commit(commit)
        lat[phase[0]].append((time.perf_counter() - sent) * 1000)


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "commits": len(ordered),
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1], 2),
        "worst_ms": round(ordered[-1], 2),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    schema = f"flowx_bench_ret_{uuid.uuid4().hex[:8]}"
    stores = PostgresStores(args.store, schema=schema, max_size=args.writers + 4)
    await stores.open()
    try:
        populate_s = _populate(args.store, schema, args.instances)
        live = []
        for _ in range(args.writers):
            iid = str(uuid.uuid4())
            await stores.journal.create(
                NewInstance(
                    instance_id=iid,
                    flow_id="bench.live",
                    flow_version="1",
                    input="{}",
                    state_bag="{}",
                ),
                token=1,
                now=None,
            )
            live.append(iid)
        lat: dict[str, list[float]] = {"baseline": [], "sweep": []}
        phase = ["baseline"]
        stop = asyncio.Event()
        writers = [asyncio.create_task(_writer(stores, iid, stop, phase, lat)) for iid in live]
        await asyncio.sleep(args.baseline)
        phase[0] = "sweep"
        started = time.perf_counter()
        report = await sweep(stores, now=datetime.now(UTC), archiver=None, page_size=args.page)
        sweep_s = time.perf_counter() - started
        stop.set()
        await asyncio.gather(*writers)
    finally:
        await stores.close()
        with psycopg.connect(args.store, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return {
        "instances": args.instances,
        "page": args.page,
        "writers": args.writers,
        "populate_s": round(populate_s, 1),
        "deleted": report.deleted,
        "sweep_s": round(sweep_s, 2),
        "deleted_per_s": round(report.deleted / sweep_s),
        "baseline": _summary(lat["baseline"]),
        "during_sweep": _summary(lat["sweep"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--instances", type=int, default=1_000_000)
    ap.add_argument("--page", type=int, default=500)
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--baseline", type=float, default=10.0, help="seconds of writers alone")
    ap.add_argument("--out", type=Path, default=RESULTS / "retention-postgresql.json")
    args = ap.parse_args()
    result = asyncio.run(run(args))
    assert result["deleted"] == args.instances, result
    doc = {
        "benchmark": "retention",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(),
            "psycopg": metadata.version("psycopg"),
        },
        "command": f"python -m benchmarks.retention --instances {args.instances} "
        f"--page {args.page} --writers {args.writers}",
        "result": result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    b, s = result["baseline"], result["during_sweep"]
    print(
        f"swept {result['deleted']:,} instances in {result['sweep_s']} s: "
        f"{result['deleted_per_s']:,} /s (page {args.page})"
    )
    print(f"{'step commits':<16}{'count':>8}{'p50 ms':>9}{'p99 ms':>9}{'worst ms':>10}")
    for name, row in (("baseline", b), ("during sweep", s)):
        print(
            f"{name:<16}{row['commits']:>8}{row['p50_ms']:>9}{row['p99_ms']:>9}"
            f"{row['worst_ms']:>10}"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
