"""Migrations 0008 and 0010 on SQLite: the state CHECK widened in place (R7.4, R9.4).

SQLite cannot alter a constraint, so the migration edits the table's definition, which
changes no stored byte. These tests hold it to what an expand step promises: every old row
stays, a node of the previous release keeps writing on its open connection, the new states
are accepted, anything else is still refused — and an edit that does not find the definition
it expects changes nothing at all.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from flowx.stores.sqlite import SqliteStores
from flowx.stores.sqlite.database import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION, _statements

#: The schema before 0008, the first migration that widens the state CHECK.
BEFORE_WIDENING = 7

OLD_STATES = (
    "Pending",
    "Running",
    "Suspended",
    "Compensating",
    "Completed",
    "Failed",
    "TimedOut",
    "CompensationFailed",
)


def journal_at(path: Path, version: int, *, edit: tuple[str, str] | None = None) -> None:
    """A journal file migrated to ``version`` as the runner of that release left it, with
    one instance in each state that release knew. ``edit`` rewrites a migration's text first
    (a file whose definition differs from the one the next migration expects)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(
        "CREATE TABLE flowx_schema_migrations (version INTEGER PRIMARY KEY, "
        "name TEXT NOT NULL, applied_at TEXT NOT NULL)"
    )
    for migration in MIGRATIONS[:version]:
        sql = migration.sql if edit is None else migration.sql.replace(*edit)
        for statement in _statements(sql):
            conn.execute(statement)
        conn.execute(
            "INSERT INTO flowx_schema_migrations VALUES (?, ?, '2026-01-01')",
            (migration.version, migration.name),
        )
    for n, state in enumerate(OLD_STATES):
        insert(conn, f"old-{n}", state)
    conn.close()


def insert(conn: sqlite3.Connection, instance_id: str, state: str) -> None:
    """What a node of release 7 writes: its own column list, none of 0008's."""
    conn.execute(
        "INSERT INTO flow_instance (instance_id, flow_id, flow_version, state, input, "
        "state_bag, created_at, updated_at) VALUES (?, 'f', '1', ?, '{}', '{}', "
        "'2026-01-01T00:00:00+00:00', '2026-01-01T00:00:00+00:00')",
        (instance_id, state),
    )


async def test_the_widened_check_keeps_old_rows_and_the_old_release_writing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "flowx.db"
    journal_at(path, BEFORE_WIDENING)
    old_node = sqlite3.connect(path, isolation_level=None)
    insert(old_node, "before", "Running")  # its schema is cached from here on

    stores = SqliteStores(path)
    await stores.open()
    try:
        assert await stores.schema_version() == SCHEMA_VERSION
        for n, state in enumerate(OLD_STATES):
            record = await stores.journal.get(f"old-{n}")
            assert record is not None and record.state.value == state
            assert record.stop_request is None
    finally:
        await stores.close()

    # The previous release, on the connection it had open, writes on and reads the new
    # column list's table; the new states are accepted, anything else still refused.
    insert(old_node, "after", "Completed")
    insert(old_node, "cancelled", "Cancelled")
    insert(old_node, "terminated", "Terminated")
    insert(old_node, "quarantined", "Quarantined")  # 0010 widened it again
    with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
        insert(old_node, "bogus", "Bogus")
    assert old_node.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    old_node.close()


async def test_an_edit_that_finds_another_definition_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "flowx.db"
    # A journal whose state list was written on one line: 0008's edit cannot find it.
    journal_at(
        path,
        BEFORE_WIDENING,
        edit=(
            "'Suspended',\n                           'Compensating'",
            "'Suspended', 'Compensating'",
        ),
    )
    stores = SqliteStores(path)
    with pytest.raises(RuntimeError, match="matched 0 definitions, not 1"):
        await stores.open()
    await stores.close()
    conn = sqlite3.connect(path)
    versions = [r[0] for r in conn.execute("SELECT version FROM flowx_schema_migrations")]
    assert versions == list(range(1, BEFORE_WIDENING + 1))
    columns = {r[1] for r in conn.execute("PRAGMA table_info(flow_instance)")}
    assert "stop_request" not in columns  # the column added before the edit is gone too
    with pytest.raises(sqlite3.IntegrityError):
        insert(conn, "x", "Cancelled")
