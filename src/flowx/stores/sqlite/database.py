"""One SQLite connection, its thread, its pragmas and its migrations.

The ``sqlite3`` module blocks, so every statement runs on one dedicated thread per database;
the event loop only awaits. One connection per process means one writer per process, and
SQLite's file lock orders writers across processes.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from flowx.stores import migrations
from flowx.stores.errors import (
    JournalUnavailable,
    NotAFlowXStore,
    SchemaNotMigrated,
    SchemaTooNew,
)
from flowx.urls import BadURL, check_sqlite_path, redact

T = TypeVar("T")

#: ``PRAGMA application_id`` of a FlowX journal ("FLWX"): how a file says what it is.
APPLICATION_ID = 0x464C5758

MIGRATIONS = migrations.load("flowx.stores.sqlite")
SCHEMA_VERSION = MIGRATIONS[-1].version


def to_text(moment: datetime) -> str:
    """Fixed-width ISO-8601 UTC text, so that string order is time order."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def from_text(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _statements(script: str) -> list[str]:
    """Split a migration into statements; ``complete_statement`` keeps trigger bodies whole."""
    out: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                out.append(buffer.strip())
            buffer = ""
    if buffer.strip() and not all(
        part.strip().startswith("--") or not part.strip() for part in buffer.splitlines()
    ):
        raise RuntimeError(f"incomplete statement at the end of a migration: {buffer!r}")
    return out


#: A migration statement that edits a table's definition in place (``writable_schema``).
_SCHEMA_EDIT = re.compile(
    r"(?:--[^\n]*\n|\s)*UPDATE\s+(?:sqlite_schema|sqlite_master)\b", re.IGNORECASE
)


def _schema_edited(conn: sqlite3.Connection, migration: migrations.Migration, edited: int) -> None:
    """After a migration edited a definition in ``sqlite_schema``: refuse an edit that did
    not find exactly the one definition it names (a silent no-op would leave the old
    constraint), then bump the schema cookie so every connection, this one included,
    re-reads the schema before its next statement."""
    if edited != 1:
        raise RuntimeError(
            f"migration {migration.version:04d}_{migration.name} edits a table definition but "
            f"matched {edited} definitions, not 1: this file's schema is not the one the "
            "migration expects; nothing was changed"
        )
    cookie = int(conn.execute("PRAGMA schema_version").fetchone()[0])
    conn.execute(f"PRAGMA schema_version = {cookie + 1}")


class SqliteDatabase:
    """The file, opened once per process; every call runs on its own thread."""

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 10_000) -> None:
        self.path = Path(path)
        #: The path as messages show it: a path is no place for a secret, but one typed
        #: there (``x.db?password=…``) is hidden like any other (R9.8).
        self.shown = redact(str(self.path), limit=None)
        self._busy_timeout_ms = busy_timeout_ms
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowx-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._pending: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise JournalUnavailable(f"SQLite store {self.shown} is not open; call open() first")
        return self._conn

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the database thread, translating driver errors."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, fn)

    async def data_version(self) -> int:
        """``PRAGMA data_version``: changes when another connection (another process) has
        committed to the file since this connection last looked."""
        return int(await self.run(lambda conn: conn.execute("PRAGMA data_version").fetchone()[0]))

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` as one atomic write, group-committed with its neighbours.

        Writes that arrive while a batch is on the database thread wait and go together in the
        next ``BEGIN IMMEDIATE … COMMIT``: one fsync for many step commits. Each write runs in
        its own savepoint, so one that raises (``FencedOut``, ``DuplicateStep``) is rolled back
        alone and the rest of its batch still commits (R2.3 holds per write).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((fn, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush(), name="flowx-sqlite-group-commit")
        return await future  # type: ignore[no-any-return]

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                outcomes = await loop.run_in_executor(self._executor, self._write_batch, batch)
            except BaseException as exc:  # the thread pool itself failed: fail the batch
                outcomes = [(False, exc)] * len(batch)
            for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                if future.done():
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

    def _write_batch(
        self, batch: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]]
    ) -> list[tuple[bool, Any]]:
        conn = self.conn
        outcomes: list[tuple[bool, Any]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            error = self._unavailable(exc)
            return [(False, error)] * len(batch)
        try:
            for fn, _ in batch:
                conn.execute("SAVEPOINT flowx_write")
                try:
                    value = fn(conn)
                except sqlite3.OperationalError as exc:
                    conn.execute("ROLLBACK TO flowx_write")
                    outcomes.append((False, self._unavailable(exc)))
                except Exception as exc:
                    conn.execute("ROLLBACK TO flowx_write")
                    outcomes.append((False, exc))
                else:
                    outcomes.append((True, value))
                conn.execute("RELEASE flowx_write")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            # Not committed: every write of the batch is refused, retryable.
            if conn.in_transaction:
                conn.rollback()
            error = self._unavailable(exc)
            return [(False, error)] * len(batch)
        return outcomes

    def _unavailable(self, exc: sqlite3.Error) -> JournalUnavailable:
        error = JournalUnavailable(
            f"SQLite store {self.shown} did not accept the write ({exc}); it is retryable once "
            "the lock holder or the disk is back"
        )
        error.__cause__ = exc
        return error

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self.conn
        try:
            return fn(conn)
        except sqlite3.OperationalError as exc:
            if conn.in_transaction:
                conn.rollback()
            raise JournalUnavailable(
                f"SQLite store {self.shown} did not accept the operation ({exc}); "
                "it is retryable once the lock holder or the disk is back"
            ) from exc
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise

    async def open(self, *, migrate: bool = True) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._open, migrate)

    def _open(self, migrate: bool) -> None:
        if self._conn is not None:
            return
        if self.path.parent and not self.path.parent.exists():
            raise JournalUnavailable(
                f"folder of SQLite store {self.shown} does not exist; create it first"
            )
        try:
            conn = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False, timeout=30
            )
        except sqlite3.OperationalError as exc:  # a directory, an unwritable folder
            check_sqlite_path(self.path)  # names the cause when it can tell
            raise BadURL(
                f"SQLite cannot open {self.shown!r} ({exc}); name a file in a "
                "folder this process may write in",
                url=self.shown,
            ) from exc
        try:
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.DatabaseError as exc:
                raise NotAFlowXStore(
                    f"{self.shown} is not an SQLite database ({exc}); point FlowX at a new "
                    "file or at an existing FlowX journal"
                ) from exc
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            conn.execute("PRAGMA foreign_keys = ON")
            # FULL: a committed step survives power loss too, not only a process crash.
            conn.execute("PRAGMA synchronous = FULL")
            self._check_and_migrate(conn, migrate)
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise JournalUnavailable(
                    f"{self.shown} could not be put in WAL mode (got {mode}); several worker "
                    "processes need it: use a local disk, not a network share"
                )
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _check_and_migrate(self, conn: sqlite3.Connection, migrate: bool) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            tables = conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
            ).fetchone()[0]
            if app_id != APPLICATION_ID and tables:
                raise NotAFlowXStore(
                    f"{self.shown} is an SQLite database but not a FlowX journal (it has "
                    f"{tables} tables and no FlowX mark); nothing was changed. Point FlowX at "
                    "a new file"
                )
            current = 0
            if tables:
                row = conn.execute("SELECT max(version) FROM flowx_schema_migrations").fetchone()
                current = int(row[0] or 0)
            if current > SCHEMA_VERSION:
                raise SchemaTooNew(self.shown, current, SCHEMA_VERSION)
            if current < SCHEMA_VERSION and not migrate:
                raise SchemaNotMigrated(
                    f"{self.shown} is at schema {current}, this FlowX needs {SCHEMA_VERSION}; "
                    "run `flowx migrate`"
                )
            if current == 0:
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute(
                    "CREATE TABLE flowx_schema_migrations (version INTEGER PRIMARY KEY, "
                    "name TEXT NOT NULL, applied_at TEXT NOT NULL)"
                )
            for migration in MIGRATIONS[current:]:
                for statement in _statements(migration.sql):
                    edited = conn.execute(statement).rowcount
                    if _SCHEMA_EDIT.match(statement):
                        _schema_edited(conn, migration, edited)
                conn.execute(
                    "INSERT INTO flowx_schema_migrations (version, name, applied_at) "
                    "VALUES (?, ?, ?)",
                    (migration.version, migration.name, to_text(datetime.now(UTC))),
                )
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def schema_version(self) -> int:
        row = self.conn.execute("SELECT max(version) FROM flowx_schema_migrations").fetchone()
        return int(row[0] or 0)

    async def close(self) -> None:
        if self._flusher is not None and not self._flusher.done():
            await self._flusher
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=True)
        # Open again later (a host that retries its stores at start-up, after another store
        # they are paired with failed): a fresh executor, whose thread starts only when used.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowx-sqlite")
