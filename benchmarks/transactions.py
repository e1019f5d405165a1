"""Transactions per flow on PostgreSQL: what B7's flows cost the server, counted by the server.

Runs B7 (``journal_throughput.run_level``: N flows of ``--steps`` no-op steps, C at a time,
through the real ``FlowHost``) in a database of its own, created for the run and dropped after,
and reads ``pg_stat_database.xact_commit + xact_rollback`` for that database before and after.
Every transaction counts: writes, reads, the lease renewals and releases, the connection
set-up of each pooled connection. The count after is read once the host has closed (its
backends have exited, so their statistics have been flushed). Issue 14's target: at most 1.2
transactions per 3-step flow under load.

    python -m benchmarks.transactions --store postgresql://postgres@127.0.0.1:5432/test

Writes ``benchmarks/results/transactions-postgresql.json`` and prints a table. It asserts
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

import flowx
from benchmarks.journal_throughput import make_plan, run_level

RESULTS = Path(__file__).resolve().parent / "results"
DATABASE = "flowx_bench_transactions"
COUNT = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s"


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


async def _count(admin: str) -> int:
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        row = await (await conn.execute(COUNT, (DATABASE,))).fetchone()
    return int(row[0]) if row else 0


async def _until_flushed(admin: str) -> int:
    """The count once it stops moving: backends flush their statistics as they exit."""
    last = await _count(admin)
    for _ in range(50):
        await asyncio.sleep(0.2)
        now = await _count(admin)
        if now == last:
            return now
        last = now
    return last


async def measure(admin: str, steps: int, instances: int, concurrency: int) -> dict[str, Any]:
    url = _with_database(admin, DATABASE)
    async with flowx.FlowHost(store=flowx.from_url(url), flows=[make_plan(steps)]):
        pass  # migrated, and the first connections' set-up counted before the baseline
    before = await _until_flushed(admin)
    result = await run_level(url, make_plan(steps), instances, concurrency)
    after = await _until_flushed(admin)
    transactions = after - before
    return {
        **result,
        "transactions": transactions,
        "transactions_per_flow": round(transactions / (instances + 1), 3),  # + the warm-up
    }


async def run(admin: str, steps: int, instances: int, levels: list[int]) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DATABASE)))
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    try:
        return [await measure(admin, steps, instances, c) for c in levels]
    finally:
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE))
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--store",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="a PostgreSQL URL whose role may create databases",
    )
    parser.add_argument("--instances", type=int, default=3000)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--concurrency", default="1,64")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    rows = asyncio.run(run(args.store, args.steps, args.instances, levels))
    out = {
        "benchmark": "transactions",
        "store": "postgresql",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "results": rows,
    }
    path = args.out or RESULTS / "transactions-postgresql.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"transactions per flow on PostgreSQL, {args.steps}-step flows, {args.instances} flows")
    print(f"{'concurrency':>12} {'flows/s':>10} {'transactions':>13} {'per flow':>9}")
    for r in rows:
        print(
            f"{r['concurrency']:>12} {r['flows_per_s']:>10} {r['transactions']:>13} "
            f"{r['transactions_per_flow']:>9}"
        )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
