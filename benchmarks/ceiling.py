"""The raw ceiling of the step commit on PostgreSQL: FlowX's own SQL, group-committed, no engine.

At each concurrency C, C "flows" run at a time until ``--instances`` have run, each doing at the
SQL level what a FlowX flow of ``--steps`` no-op steps does (B7, ``journal_throughput``): its
start, leased (``CREATE_LEASED`` alone, ``CREATE_LEASED_BATCH`` for starts that arrive
together), then one step commit per step (``COMMIT`` alone, ``COMMIT_BATCH`` with FlowX's
``batch_params`` for commits that arrive together; the last moves the instance to Completed),
then the lease release (``RELEASE_MANY``). The statements are imported from
``flowx.stores.postgres``, never copied, and their parameters built by FlowX's own helpers;
the payloads are those B7's flow writes (input ``{"n":N}``, result ``N``, state bag
``{"last":N}``).

Group commit as FlowX does it (a lone write at once, a second batch beside one in flight only
once 32 wait, up to 4 in flight for commits and for starts, releases on one
``synchronous_commit = off`` connection), every statement prepared, connections held for the
run: the writes, the batcher and the two drivers live in
``benchmarks.ceiling_arms``; this module holds the CLI, the interleaved rounds, the schemas and
the after-run check, and the table and JSON report.

Arms, run in one process, interleaved round by round in alternating order, each on a fresh
schema migrated by FlowX itself (dropped at the end):

- ``psycopg``: psycopg 3 ``AsyncConnection``s, autocommit, ``prepare=True``;
- ``asyncpg``: the same SQL text, its ``%(name)s`` placeholders rewritten to ``$n`` exactly as
  psycopg does (a repeated name keeps its number); asyncpg prepares and caches every statement.
  Skipped if asyncpg is not installed (a measured-only dependency: ``pip install asyncpg``);
- ``engine``: B7 itself (``journal_throughput.run_level``), the real ``FlowHost``;
- ``engine-asyncpg``: B7 on the same ``FlowHost`` and plan, its store a ``PostgresStores``
  whose hot-path writes go through asyncpg (``benchmarks.engine_asyncpg``): the
  group-created starts, the group step commits and the batched lease releases, run by
  FlowX's own ``GroupCreator``, ``GroupCommitter`` and ``ReleaseBatcher`` code (same SQL,
  parameter builders and outcome handling) on asyncpg connections held one per batch lane.
  Reads, opens, claims, lease acquisitions and renewals stay on psycopg. Issue 14 item 4:
  a switch to asyncpg only on a measured ``engine-asyncpg/engine`` of 1.3x or more. Skipped
  if asyncpg is not installed.

``--loop uvloop`` runs the engine arms on uvloop (a measured-only dependency); the raw arms
stay on asyncio.

Every arm warms up alike, untimed: one flow alone and then C at once (every connection's
statements prepared, lone and batched). Each run is checked afterwards: every
instance Completed with its step rows, every lease released.

    python -m benchmarks.ceiling --store postgresql://postgres@127.0.0.1:5432/test

Writes ``benchmarks/results/ceiling-<steps>steps.json`` (step-commits/s = steps x flows /
elapsed, and flows/s, per arm and C: medians over rounds; the ratios engine/psycopg,
engine/asyncpg, asyncpg/psycopg and engine-asyncpg/engine, medians of each round's ratio), or
``--out``, and prints a table. A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import statistics
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg

import flowx
from benchmarks.ceiling_arms import (
    MAX_BATCH,
    MAX_INFLIGHT,
    RELEASE_BATCH,
    Asyncpg,
    Driver,
    Psycopg,
    RawFlows,
    run_flows,
)
from benchmarks.engine_asyncpg import AsyncpgStores, available
from benchmarks.journal_throughput import make_plan, percentile, run_level

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_STORE = "postgresql://postgres@127.0.0.1:5432/test"
ARMS = ("psycopg", "asyncpg", "engine", "engine-asyncpg")
#: The arms that run B7 through the real engine, and the store each builds from its URL.
ENGINE_ARMS = ("engine", "engine-asyncpg")


# --- schemas and the arms' runs ---------------------------------------------------------------


def with_schema(url: str, schema: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "flowx_schema"]
    query.append(("flowx_schema", schema))
    return urlunsplit(parts._replace(query=urlencode(query)))


def plain(url: str) -> str:
    """The server URL without FlowX's own ``flowx_schema`` parameter."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "flowx_schema"]
    return urlunsplit(parts._replace(query=urlencode(query)))


async def migrate(url: str, schema: str) -> None:
    """A fresh schema, made by FlowX's own migrations."""
    stores = flowx.postgres(with_schema(url, schema))
    await stores.open()
    await stores.close()


async def check(url: str, schema: str, flows: int, steps: int) -> dict[str, Any]:
    """What the run left: every instance Completed with its step rows, every lease ended."""
    async with await psycopg.AsyncConnection.connect(
        plain(url), autocommit=True, options=f"-c search_path={schema}"
    ) as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM flow_instance), "
            "(SELECT count(*) FROM flow_instance WHERE state = 'Completed'), "
            "(SELECT count(*) FROM flow_step), "
            "(SELECT count(*) FROM flow_lease WHERE expires_at <= now())"
        )
        row = await cur.fetchone()
    assert row is not None
    instances, completed, step_rows, released = (int(v) for v in row)
    ok = instances == completed == released == flows and step_rows == flows * steps
    return {
        "instances": instances,
        "completed": completed,
        "step_rows": step_rows,
        "leases_released": released,
        "ok": ok,
    }


async def raw_level(
    driver: Driver, url: str, schema: str, steps: int, instances: int, concurrency: int
) -> dict[str, Any]:
    await migrate(url, schema)
    flows = RawFlows(driver, plain(url), schema, steps)
    await flows.open()
    try:
        await flows.flow(-1)  # warm-up: each lone statement prepared
        if concurrency > 1:  # and the batched ones, on every connection
            await run_flows(flows.flow, concurrency, concurrency)
        warm = 1 + (concurrency if concurrency > 1 else 0)
        flows.latencies.clear()
        for group in (flows.creates, flows.commits, flows.releases):
            group.batches = group.items = 0
        started = time.perf_counter()
        await run_flows(flows.flow, instances, concurrency)
        elapsed = time.perf_counter() - started
    finally:
        await flows.close()
    lat = flows.latencies
    step_commits = instances * steps
    return {
        "concurrency": concurrency,
        "instances": instances,
        "steps_per_instance": steps,
        "elapsed_s": round(elapsed, 3),
        "step_commits": step_commits,
        "step_commits_per_s": round(step_commits / elapsed, 1),
        "flows_per_s": round(instances / elapsed, 1),
        "commit_p50_ms": round(percentile(lat, 0.50) * 1000, 3),
        "commit_p99_ms": round(percentile(lat, 0.99) * 1000, 3),
        "commit_mean_ms": round(statistics.fmean(lat) * 1000, 3) if lat else 0.0,
        "commit_batches": flows.commits.batches,
        "commits_per_batch": round(flows.commits.items / max(1, flows.commits.batches), 2),
        "creates_per_batch": round(flows.creates.items / max(1, flows.creates.batches), 2),
        "releases_per_batch": round(flows.releases.items / max(1, flows.releases.batches), 2),
        "check": await check(url, schema, instances + warm, steps),
    }


async def engine_level(
    arm: str, url: str, schema: str, steps: int, instances: int, concurrency: int
) -> dict[str, Any]:
    await migrate(url, schema)
    if arm == "engine-asyncpg":
        result = await run_level(
            url,
            make_plan(steps),
            instances,
            concurrency,
            make_store=lambda _: AsyncpgStores(plain(url), schema=schema),
            warm_together=True,
        )
    else:
        result = await run_level(
            with_schema(url, schema), make_plan(steps), instances, concurrency, warm_together=True
        )
    warm = 1 + (concurrency if concurrency > 1 else 0)
    result["check"] = await check(url, schema, instances + warm, steps)
    return result


def run_arm(
    arm: str, driver: Driver | None, url: str, schema: str, args: argparse.Namespace, level: int
) -> dict[str, Any]:
    """One arm at one level, in an event loop of its own (uvloop's for the engine arms under
    ``--loop uvloop``); an error is recorded, not raised."""
    try:
        factory = None
        if driver is None:
            coro = engine_level(arm, url, schema, args.steps, args.instances, level)
            if args.loop == "uvloop":
                import uvloop  # a measured-only dependency: benchmarks/event_loops.py

                factory = uvloop.new_event_loop
        else:
            coro = raw_level(driver, url, schema, args.steps, args.instances, level)
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(coro)
    except Exception as exc:
        print(f"  {arm} at {level} failed: {type(exc).__name__}: {exc}")
        return {"concurrency": level, "error": f"{type(exc).__name__}: {exc}"}


# --- the report -------------------------------------------------------------------------------


async def server_info(url: str) -> dict[str, str]:
    info: dict[str, str] = {}
    async with await psycopg.AsyncConnection.connect(plain(url), autocommit=True) as conn:
        for name in ("server_version", "synchronous_commit", "fsync", "commit_delay"):
            row = await (await conn.execute(f"SHOW {name}")).fetchone()
            info[name] = str(row[0]) if row else ""
    return info


async def drop_schemas(url: str, schemas: list[str]) -> None:
    async with await psycopg.AsyncConnection.connect(plain(url), autocommit=True) as conn:
        for schema in schemas:
            await conn.execute(
                psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    psycopg.sql.Identifier(schema)
                )
            )


def version_of(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return round(statistics.median(values), 1) if values else None


def ratio(runs: dict[str, list[dict[str, Any]]], top: str, bottom: str) -> dict[str, Any] | None:
    """``top``/``bottom`` step-commits/s: each round's, and their median."""
    if top not in runs or bottom not in runs:
        return None
    per_round = [
        round(a["step_commits_per_s"] / b["step_commits_per_s"], 3)
        for a, b in zip(runs[top], runs[bottom], strict=True)
        if "step_commits_per_s" in a and "step_commits_per_s" in b
    ]
    if not per_round:
        return None
    return {"median": round(statistics.median(per_round), 3), "rounds": per_round}


def summarise(level: int, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    arms = {
        arm: {
            "step_commits_per_s": median_of(rs, "step_commits_per_s"),
            "flows_per_s": median_of(rs, "flows_per_s"),
            "commit_p50_ms": median_of(rs, "commit_p50_ms"),
            "commit_p99_ms": median_of(rs, "commit_p99_ms"),
            "commits_per_batch": median_of(rs, "commits_per_batch"),
            "runs": rs,
        }
        for arm, rs in runs.items()
    }
    return {
        "concurrency": level,
        "arms": arms,
        "ratios": {
            "engine/psycopg": ratio(runs, "engine", "psycopg"),
            "engine/asyncpg": ratio(runs, "engine", "asyncpg"),
            "asyncpg/psycopg": ratio(runs, "asyncpg", "psycopg"),
            "engine-asyncpg/engine": ratio(runs, "engine-asyncpg", "engine"),
        },
    }


def print_table(record: dict[str, Any]) -> None:
    print(
        f"Raw step-commit ceiling on PostgreSQL {record['machine']['server_version']}: "
        f"{record['instances']} instances x {record['steps']} steps, "
        f"{record['rounds']} round(s), medians"
    )
    cols = ["C", "arm", "step_commits/s", "flows/s", "p50_ms", "p99_ms", "per_batch"]
    print("  ".join(f"{c:>14}" for c in cols))
    for level in record["levels"]:
        for arm, s in level["arms"].items():
            cells = [
                level["concurrency"],
                arm,
                s["step_commits_per_s"],
                s["flows_per_s"],
                s["commit_p50_ms"],
                s["commit_p99_ms"],
                s["commits_per_batch"] if s["commits_per_batch"] is not None else "-",
            ]
            print("  ".join(f"{'-' if c is None else c:>14}" for c in cells))
    print("ratios of step-commits/s (median over rounds of each round's ratio):")
    names = ["engine/psycopg", "engine/asyncpg", "asyncpg/psycopg", "engine-asyncpg/engine"]
    print("  ".join(f"{c:>21}" for c in ["C", *names]))
    for level in record["levels"]:
        cells = [level["concurrency"]]
        for name in names:
            r = level["ratios"][name]
            cells.append(f"{r['median']:.0%}" if r else "-")
        print("  ".join(f"{c:>21}" for c in cells))
    target = {3: 0.60, 10: 0.75}.get(record["steps"])
    at64 = next((lv for lv in record["levels"] if lv["concurrency"] == 64), None)
    if target and at64 and at64["ratios"]["engine/psycopg"]:
        got = at64["ratios"]["engine/psycopg"]["median"]
        print(
            f"issue 14 target at C=64, {record['steps']} steps: engine >= {target:.0%} of raw "
            f"psycopg; measured {got:.0%}"
        )
    failed = [
        f"{arm}@{lv['concurrency']}"
        for lv in record["levels"]
        for arm, s in lv["arms"].items()
        for r in s["runs"]
        if "error" in r or not r.get("check", {}).get("ok", False)
    ]
    if failed:
        print(f"runs that failed or left the journal wrong: {', '.join(failed)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=DEFAULT_STORE, help="PostgreSQL URL")
    parser.add_argument("--instances", type=int, default=1500)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--arms", default=",".join(ARMS), help="of psycopg,asyncpg,engine,engine-asyncpg"
    )
    parser.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="the engine arms' event loop (uvloop: measured only, `pip install uvloop`)",
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    args = parser.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    unknown = set(arms) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms: {', '.join(sorted(unknown))}")
    drivers: dict[str, Driver | None] = {}
    for arm in arms:
        if arm == "psycopg":
            drivers[arm] = Psycopg()
        elif arm == "asyncpg":
            try:
                drivers[arm] = Asyncpg()
            except ImportError:
                print("asyncpg is not installed (pip install asyncpg): its arm is skipped")
        elif arm == "engine-asyncpg":
            if available():
                drivers[arm] = None
            else:
                print("asyncpg is not installed (pip install asyncpg): engine-asyncpg is skipped")
        else:
            drivers[arm] = None
    levels = [int(c) for c in args.concurrency.split(",")]
    tag = secrets.token_hex(3)
    schemas: list[str] = []
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {
        lv: {a: [] for a in drivers} for lv in levels
    }
    try:
        for rnd in range(args.rounds):
            order = list(drivers) if rnd % 2 == 0 else list(reversed(drivers))
            for level in levels:
                for arm in order:
                    schema = f"ceiling_{tag}_r{rnd}_c{level}_{arm.replace('-', '_')}"
                    schemas.append(schema)
                    result = run_arm(arm, drivers[arm], args.store, schema, args, level)
                    runs[level][arm].append(result)
                    print(
                        f"round {rnd + 1} C={level:<3} {arm:<14} "
                        f"{result.get('step_commits_per_s', 'error')} step-commits/s"
                    )
    finally:
        asyncio.run(drop_schemas(args.store, schemas))
    record = {
        "benchmark": "raw step-commit ceiling (FlowX's commit SQL, group-committed, no engine)",
        "store": "postgresql",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "psycopg": version_of("psycopg"),
            "asyncpg": version_of("asyncpg")
            if {"asyncpg", "engine-asyncpg"} & set(drivers)
            else None,
            "uvloop": version_of("uvloop") if args.loop == "uvloop" else None,
            **asyncio.run(server_info(args.store)),
        },
        "instances": args.instances,
        "steps": args.steps,
        "rounds": args.rounds,
        "arms": list(drivers),
        "engine_loop": args.loop,
        "batching": {
            "max_batch": MAX_BATCH,
            "batches_in_flight": MAX_INFLIGHT,
            "release_batch": RELEASE_BATCH,
            "release_synchronous_commit": "off",
        },
        "note": (
            "step_commits_per_s = steps x instances / elapsed; the raw arms run FlowX's "
            "CREATE_LEASED(_BATCH), COMMIT(_BATCH) and RELEASE_MANY, imported; engine is "
            "journal_throughput.run_level (B7); engine-asyncpg is B7 with its starts, step "
            "commits and lease releases sent by asyncpg (benchmarks.engine_asyncpg); ratios "
            "are medians of per-round ratios"
        ),
        "levels": [summarise(lv, runs[lv]) for lv in levels],
    }
    out = args.out or RESULTS / f"ceiling-{args.steps}steps.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print_table(record)
    print(f"written to {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out}")


if __name__ == "__main__":
    main()
