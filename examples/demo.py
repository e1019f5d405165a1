"""``make demo``: crash a worker mid-flight and watch another one finish its work.

1. A node process starts 50 order flows on the embedded SQLite journal (or on PostgreSQL with
   ``--store postgresql://...`` / ``FLOWX_DEMO_STORE``) and runs them.
2. Once it is well into them, the demo SIGKILLs it: no drain, no release, no goodbye.
3. A second process, ``flowx worker``, finds the abandoned instances with its recovery scan
   (lease TTL 2 s here) and finishes each from its last commit.
4. The demo reads the journal and the effect ledger and prints what happened. It exits 0 only
   if every instance completed and no step ran twice except where the kill fell between an
   effect and its commit.

On PostgreSQL the demo keeps its journal in a schema of its own, ``flowx_demo`` (or the
``?flowx_schema=`` named in the URL, which must start with ``flowx_demo``), and drops and
recreates that schema first, so every run starts fresh. The effect ledger stays in SQLite
either way: it stands for the world outside the journal.
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
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
DEMO_SCHEMA = "flowx_demo"


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


class SqliteJournal:
    """Reads an SQLite file with the stdlib: the embedded journal (the default), the ledger."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        self.shown = self.url

    def query(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(self.path, timeout=30)  # read-only use; may recover the WAL
        try:
            return list(conn.execute(sql, args))
        finally:
            conn.close()

    def count(self, sql: str, *args: object) -> int:
        if not self.path.exists():
            return 0
        try:
            rows = self.query(sql, *args)
        except sqlite3.OperationalError as exc:
            # The node creates the file, then migrates it: between the two there is a file
            # with no tables yet, which is "nothing started", not an error.
            if "no such table" in str(exc):
                return 0
            raise
        return int(rows[0][0] or 0) if rows else 0

    def first_commits_after(self, at: datetime) -> list[tuple[Any, datetime]]:
        rows = self.query(
            "SELECT instance_id, min(committed_at) FROM flow_step WHERE committed_at > ? "
            "GROUP BY instance_id",
            at.isoformat(timespec="microseconds"),
        )
        return [(iid, datetime.fromisoformat(str(first))) for iid, first in rows]

    def close(self) -> None:
        pass


class PostgresJournal:
    """Reads a PostgreSQL journal with psycopg, in the demo's own schema."""

    def __init__(self, url: str) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise SystemExit(
                "demo: a PostgreSQL store needs psycopg: "
                f"pip install 'flowx-runtime[postgres]' ({exc})"
            ) from exc
        from flowx.stores.postgres.database import redact

        self._psycopg = psycopg
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        named = [v for k, v in query if k == "flowx_schema"]
        self.schema = named[-1] if named else DEMO_SCHEMA
        if not self.schema.startswith(DEMO_SCHEMA):
            raise SystemExit(
                f"demo: refusing schema {self.schema!r}: the demo drops and recreates its "
                f"schema, so its name must start with {DEMO_SCHEMA!r} (leave flowx_schema out "
                f"to use {DEMO_SCHEMA!r})"
            )
        rest = [(k, v) for k, v in query if k != "flowx_schema"]
        self.dsn = urlunsplit(parts._replace(query=urlencode(rest)))
        # What the node and the worker get: from_url reads ?flowx_schema= itself.
        self.url = urlunsplit(
            parts._replace(query=urlencode([*rest, ("flowx_schema", self.schema)]))
        )
        self.shown = f"{redact(self.dsn)} (schema {self.schema})"
        self._conn: Any = None

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = self._psycopg.connect(
                self.dsn,
                autocommit=True,
                connect_timeout=5,
                options=f"-c search_path={self.schema} -c TimeZone=UTC",
            )
        return self._conn

    def reset(self) -> None:
        """A fresh run: drop the demo's schema with everything in it, and recreate it."""
        from psycopg import sql

        conn = self._connection()
        name = sql.Identifier(self.schema)
        with conn.transaction():
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(name))
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(name))

    def query(self, text: str, *args: object) -> list[tuple[Any, ...]]:
        # The demo's own constant queries, written with SQLite's `?`; psycopg's is `%s`.
        return list(self._connection().execute(text.replace("?", "%s"), args).fetchall())

    def count(self, text: str, *args: object) -> int:
        try:
            rows = self.query(text, *args)
        except self._psycopg.errors.UndefinedTable:
            return 0  # the node has not migrated the fresh schema yet
        return int(rows[0][0] or 0) if rows else 0

    def first_commits_after(self, at: datetime) -> list[tuple[Any, datetime]]:
        rows = self.query(
            "SELECT instance_id, min(committed_at) FROM flow_step WHERE committed_at > ? "
            "GROUP BY instance_id",
            at,
        )
        return [(iid, first) for iid, first in rows]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


Journal = SqliteJournal | PostgresJournal


def _open_journal(store: str | None, work: Path) -> Journal:
    if not store:
        return SqliteJournal(work / "flowx.db")
    if store.startswith(("postgresql://", "postgres://")):
        journal = PostgresJournal(store)
        journal.reset()
        return journal
    raise SystemExit(
        f"demo: --store takes a postgresql://... URL, not {store!r}; leave it out for the "
        "embedded SQLite journal"
    )


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise SystemExit(f"demo: timed out after {timeout:.0f}s waiting for {what}")


#: Where ``make ui`` serves the web UI over the demo's journal.
UI_URL = "http://127.0.0.1:8080/ui/"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--dir", default=str(ROOT / ".demo"))
    parser.add_argument(
        "--store",
        default=os.environ.get("FLOWX_DEMO_STORE") or None,
        help="run on PostgreSQL: postgresql://user@host:5432/db (also FLOWX_DEMO_STORE); "
        "default: the embedded SQLite journal in --dir",
    )
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
    journal = _open_journal(args.store, work)
    try:
        return _run(journal, work / "ledger.db", args.count)
    finally:
        journal.close()


def _run(journal: Journal, ledger: Path, total: int) -> int:
    db_url = journal.url
    env = {
        **os.environ,
        "FLOWX_DEMO_LEDGER": str(ledger),
        "FLOWX_LEASE_TTL": "2s",
        "FLOWX_RECOVERY_SCAN_INTERVAL": "500ms",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    print(f"FlowX demo: {total} order flows on {journal.shown}")

    began = time.monotonic()
    victim = subprocess.Popen(
        [sys.executable, "-m", "examples.demo", "--count", str(total), "node", "--db", db_url],
        cwd=ROOT,
        env=env,
    )
    # Kill once every order has been started, while the later ones are still in flight.
    _wait(
        lambda: journal.count("SELECT count(*) FROM flow_instance") == total,
        60,
        "the first node to start every order",
    )
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_at = datetime.now(UTC)
    kill_mono = time.monotonic()
    done_q = "SELECT count(*) FROM flow_instance WHERE state = 'Completed'"
    completed_before = journal.count(done_q)
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
        _wait(lambda: journal.count(done_q) == total, 60, "every instance to complete")
        all_done = time.monotonic() - kill_mono
    finally:
        worker.send_signal(signal.SIGTERM)
        worker_rc = worker.wait(timeout=30)

    # -- what happened, read from the journal and the ledger --------------------------------
    completed = journal.count(done_q)
    states = journal.query("SELECT state, count(*) FROM flow_instance GROUP BY state")
    effects = SqliteJournal(ledger).query(
        "SELECT instance_id, step, count(*) FROM ledger GROUP BY instance_id, step"
    )
    re_executed = sum(int(n) - 1 for _, _, n in effects if int(n) > 1)
    success_rows = journal.count(
        "SELECT count(*) FROM flow_step WHERE outcome = 'Success' AND capability_id IS NOT NULL",
    )
    ledger_rows = sum(int(n) for _, _, n in effects)
    resumed = journal.first_commits_after(killed_at)
    waits = sorted((at - killed_at).total_seconds() for _, at in resumed)
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
        per_instance[instance_id] = per_instance.get(instance_id, 0) + int(n) - 1
    # One step per instance is in flight at a time, so one kill re-executes at most one.
    ok = (
        completed == total
        and worker_rc == 0
        and re_executed <= in_flight
        and max(per_instance.values(), default=0) <= 1
    )
    print()
    print("  OK: every instance completed" if ok else "  FAILED: see the table above")
    print()
    if journal.url.startswith("sqlite"):
        print(f"  Look at them in the web UI: {UI_URL}  (`make ui` serves it; Ctrl-C stops it)")
    else:
        serve = f"flowx serve --db {journal.shown} --flows examples.order_flow:FLOWS"
        print(f"  Look at them in the web UI: {UI_URL}  (`{serve}` serves it)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
