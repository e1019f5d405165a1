"""Migrations are expand/contract: each leaves the previous release working (R7.4).

The release-k statements below are what a node built for schema version k sends: explicit
column lists, only the columns that existed at k. Each is run before migration k+1 (prepared
on its connection, as psycopg does for hot statements) and again after it, on new ids.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import flowx.stores.postgres
import flowx.stores.sqlite
from flowx.stores import migrations
from flowx.stores.postgres import PostgresStores
from flowx.stores.postgres.database import MIGRATIONS, SCHEMA_VERSION, apply
from flowx.stores.records import StepCommit
from flowx.testing.conformance._support import T0, at, event, new_id, step
from tests.postgres.support import (
    MIGRATIONS_TABLE_DDL,
    PG_DSN,
    aconnect,
    connect,
    create_schema,
    open_stores,
)

PG_FOLDER = Path(flowx.stores.postgres.__file__).parent / "migrations"
SQLITE_FOLDER = Path(flowx.stores.sqlite.__file__).parent / "migrations"
FOLDERS = {"postgres": PG_FOLDER, "sqlite": SQLITE_FOLDER}

_FORBIDDEN = re.compile(r"\b(DROP|RENAME)\b|\bSET\s+NOT\s+NULL\b", re.IGNORECASE)
_LINE_COMMENT = re.compile(r"--[^\n]*")
# `CHECK (column IN ('a', 'b'))`, quotes single or doubled (inside an SQL string literal).
_CHECK_LIST = re.compile(r"CHECK\s*\(\s*(\w+)\s+IN\s*\(([^()]*)\)\s*\)", re.IGNORECASE)
# PostgreSQL: a CHECK replaced by one of the same name in one statement.
_PG_SWAP = re.compile(
    r"DROP\s+CONSTRAINT\s+(\w+)\s*,\s*ADD\s+CONSTRAINT\s+(\w+)\s+(CHECK\s*\(.*?\)\s*\))",
    re.IGNORECASE | re.DOTALL,
)
# SQLite: a table definition edited in place, `replace(sql, 'old text', 'new text')`.
_LITE_EDIT = re.compile(
    r"UPDATE\s+(?:sqlite_schema|sqlite_master)\s+SET\s+sql\s*=\s*replace\(\s*sql\s*,\s*'((?:[^']|'')*)'\s*,"
    r"\s*'((?:[^']|'')*)'\s*\)",
    re.IGNORECASE,
)


def check_lists(sql_text: str) -> dict[str, frozenset[str]]:
    """Every `CHECK (column IN (...))` in ``sql_text``: the values each column may take."""
    return {
        m[1].lower(): frozenset(re.findall(r"'+([^',]+)'+", m[2]))
        for m in _CHECK_LIST.finditer(sql_text)
    }


def _widening(old: dict[str, frozenset[str]], new: dict[str, frozenset[str]], known: Any) -> bool:
    """One CHECK list replaced by another on the same column that keeps every value the
    column could hold before (``known``: the lists earlier migrations left)."""
    if len(new) != 1 or set(new) != set(old or new):
        return False
    ((column, values),) = new.items()
    before = old.get(column) if old else known.get(column)
    return before is not None and known.get(column) == before and values >= before


def contract_statements(sql_text: str, known: dict[str, frozenset[str]] | None = None) -> list[str]:
    """The forbidden words (DROP, RENAME, SET NOT NULL) in ``sql_text``, comments ignored.

    A CHECK constraint replaced by a *wider* one is an expand step, not a contract: the old
    rows all still pass, and a node of the previous release writes only values both lists
    hold. So a `DROP CONSTRAINT c, ADD CONSTRAINT c CHECK (col IN (...))` (PostgreSQL) or an
    in-place `replace(sql, 'old CHECK', 'new CHECK')` of a table definition (SQLite) passes
    when the new list holds every value of ``known`` (the lists the earlier migrations left
    for that column). A narrower or different one is reported as the DROP it is."""
    text = _LINE_COMMENT.sub("", sql_text)
    known = known or {}
    for m in list(_PG_SWAP.finditer(text)):
        if m[1] == m[2] and _widening({}, check_lists(m[3]), known):
            text = text.replace(m[0], " ")
    for m in list(_LITE_EDIT.finditer(text)):
        if _widening(check_lists(m[1]), check_lists(m[2]), known):
            text = text.replace(m[0], " ")
        else:
            text = text.replace(m[0], " DROP ")
    return [" ".join(m[0].upper().split()) for m in _FORBIDDEN.finditer(text)]


def _sql_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.sql"))


# --------------------------------------------------------------------------- static checks


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("ALTER TABLE flow_step DROP COLUMN result;", ["DROP"]),
        ("drop index flow_instance_queued_idx", ["DROP"]),
        ("ALTER TABLE flow_instance RENAME COLUMN input TO payload;", ["RENAME"]),
        ("alter table t alter column c set  not\n   null;", ["SET NOT NULL"]),
        ("ALTER TABLE t ADD COLUMN c int; -- fine\nALTER TABLE t DROP c;", ["DROP"]),
        ("-- we never DROP or RENAME, nor SET NOT NULL\nALTER TABLE t ADD COLUMN c int;", []),
        ("ALTER TABLE t ADD COLUMN dropped_at timestamptz, ADD COLUMN renamed bool;", []),
        ("ALTER TABLE t ALTER COLUMN c SET DEFAULT 0; ALTER TABLE t ADD CHECK (c IS NOT NULL)", []),
    ],
)
def test_the_contract_check_finds_forbidden_statements(text: str, found: list[str]) -> None:
    """R7.4: the checker itself rejects what it must and passes what it may."""
    assert contract_statements(text) == found


@pytest.mark.parametrize("backend", sorted(FOLDERS))
def test_no_migration_after_the_first_drops_renames_or_sets_not_null(backend: str) -> None:
    """R7.4: only expand steps after 0001 (a widened CHECK is one); a contract needs a
    release of its own."""
    files = _sql_files(FOLDERS[backend])
    assert files and files[0].name.startswith("0001_")
    known = check_lists(files[0].read_text("utf-8"))
    offences = {}
    for f in files[1:]:
        text = f.read_text("utf-8")
        if found := contract_statements(text, known):
            offences[f.name] = found
        plain = _LINE_COMMENT.sub("", text)
        known = {**known, **check_lists(_LITE_EDIT.sub("", plain).split("WHERE")[0])}
        for edit in _LITE_EDIT.finditer(plain):
            known = {**known, **check_lists(edit[2])}
    assert offences == {}
    assert known["state"] >= {"Cancelled", "Terminated"}  # 0008 was read as a widening


_STATES = "CHECK (state IN ('Pending', 'Running'))"
_KNOWN = {"state": frozenset({"Pending", "Running"})}


@pytest.mark.parametrize(
    ("text", "found"),
    [
        # PostgreSQL: the same constraint, every old value kept: an expand step.
        (
            "ALTER TABLE t DROP CONSTRAINT t_state_check, ADD CONSTRAINT t_state_check "
            "CHECK (state IN ('Pending', 'Running', 'Cancelled')) NOT VALID;",
            [],
        ),
        # A value dropped: rows in that state would break the constraint.
        (
            "ALTER TABLE t DROP CONSTRAINT t_state_check, ADD CONSTRAINT t_state_check "
            "CHECK (state IN ('Pending', 'Cancelled'));",
            ["DROP"],
        ),
        # Dropped and replaced under another name, or on another column: not a widening.
        (
            "ALTER TABLE t DROP CONSTRAINT t_state_check, ADD CONSTRAINT other "
            "CHECK (state IN ('Pending', 'Running', 'Cancelled'));",
            ["DROP"],
        ),
        (
            "ALTER TABLE t DROP CONSTRAINT t_state_check, ADD CONSTRAINT t_state_check "
            "CHECK (kind IN ('Pending', 'Running', 'Cancelled'));",
            ["DROP"],
        ),
        ("ALTER TABLE t DROP CONSTRAINT t_state_check;", ["DROP"]),
        # SQLite: a definition edited in place from the known list to a wider one.
        (
            "UPDATE sqlite_schema SET sql = replace(sql, 'CHECK (state IN (''Pending'', "
            "''Running''))', 'CHECK (state IN (''Pending'', ''Running'', ''Cancelled''))') "
            "WHERE name = 't';",
            [],
        ),
        (
            "UPDATE sqlite_schema SET sql = replace(sql, 'CHECK (state IN (''Pending'', "
            "''Running''))', 'CHECK (state IN (''Pending''))') WHERE name = 't';",
            ["DROP"],
        ),
        # An edit from a list that is not the one the column has: it would match nothing.
        (
            "UPDATE sqlite_schema SET sql = replace(sql, 'CHECK (state IN (''Pending''))', "
            "'CHECK (state IN (''Pending'', ''Running'', ''X''))') WHERE name = 't';",
            ["DROP"],
        ),
    ],
)
def test_the_contract_check_tells_a_widened_check_from_a_destructive_one(
    text: str, found: list[str]
) -> None:
    """R7.4: widening a CHECK is an expand step; narrowing or dropping one is a contract."""
    assert check_lists(_STATES) == _KNOWN
    assert contract_statements(text, _KNOWN) == found


@pytest.mark.parametrize("backend", sorted(FOLDERS))
def test_every_sql_file_is_a_migration_the_runner_loads(backend: str) -> None:
    """A file the name pattern misses would be skipped silently, on one backend only."""
    package = f"flowx.stores.{backend}"
    loaded = {f"{m.version:04d}_{m.name}.sql" for m in migrations.load(package)}
    assert loaded == {f.name for f in _sql_files(FOLDERS[backend])}


def test_both_backends_have_the_same_migrations() -> None:
    """Parity: one version number means the same change in SQLite and PostgreSQL."""
    pg = [(m.version, m.name) for m in migrations.load("flowx.stores.postgres")]
    lite = [(m.version, m.name) for m in migrations.load("flowx.stores.sqlite")]
    assert pg == lite
    assert [f.name for f in _sql_files(PG_FOLDER)] == [f.name for f in _sql_files(SQLITE_FOLDER)]
    assert pg[-1][0] == SCHEMA_VERSION


# --------------------------------------------------------------------------- expand/contract


async def _new_journal_at(schema: str, version: int) -> None:
    """A fresh schema migrated to ``version`` by the runner's own ``apply``."""
    create_schema(schema)
    async with await aconnect(schema) as conn:
        await conn.execute(MIGRATIONS_TABLE_DDL)
        async with conn.transaction():
            for migration in MIGRATIONS[:version]:
                await apply(conn, migration)


async def _migrate(schema: str, to: int) -> None:
    """Apply migration ``to`` from another connection (another node, an operator)."""
    async with await aconnect(schema) as conn, conn.transaction():
        await apply(conn, MIGRATIONS[to - 1])


async def _run_release(conn: psycopg.AsyncConnection[Any], k: int) -> str:
    """One instance's life as a node on release ``k`` writes and reads it. Returns its id."""
    iid, eid = new_id(), new_id()
    await conn.execute(
        "INSERT INTO flow_instance (instance_id, flow_id, flow_version, tenant_id, state, fence, "
        "input, state_bag, idempotency_key, created_at, updated_at) "
        "VALUES (%s, 'release.flow', %s, 't-1', 'Pending', 1, %s::json, '{}', %s, %s, %s)",
        (iid, f"{k}.0.0", f'{{"k": {k}}}', f"key-{iid}", T0, T0),
        prepare=True,
    )
    await conn.execute(
        "INSERT INTO flow_lease (instance_id, owner_node, fencing_token, expires_at, acquired_at) "
        "VALUES (%s, 'node', 1, %s, %s) ON CONFLICT (instance_id) DO UPDATE "
        "SET fencing_token = flow_lease.fencing_token + 1 WHERE flow_lease.expires_at <= %s",
        (iid, at(30), T0, T0),
        prepare=True,
    )
    async with conn.transaction():
        row = await (
            await conn.execute(
                "SELECT fence, next_sequence FROM flow_instance WHERE instance_id = %s FOR UPDATE",
                (iid,),
                prepare=True,
            )
        ).fetchone()
        assert row == (1, 1)
        seq = row[1]
        await conn.execute(
            "INSERT INTO flow_step (instance_id, scope, step_id, attempt, sequence, step_name, "
            "outcome, result, capability_id, capability_version, duration_ms, committed_at) "
            "VALUES (%s, '', 1, 1, %s, 'first', 'Success', '\"ok\"', 'cap', '1', 5, %s)",
            (iid, seq, at(1)),
            prepare=True,
        )
        if k >= 2:  # release 2 knows which commit its snapshot is of
            await conn.execute(
                "UPDATE flow_instance SET state = 'Running', state_bag = %s::json, "
                "state_bag_sequence = %s, next_sequence = next_sequence + 1, updated_at = %s, "
                "version = version + 1 WHERE instance_id = %s",
                ('{"done": [1]}', seq, at(1), iid),
                prepare=True,
            )
        else:
            await conn.execute(
                "UPDATE flow_instance SET state = 'Running', state_bag = %s::json, "
                "next_sequence = next_sequence + 1, updated_at = %s, version = version + 1 "
                "WHERE instance_id = %s",
                ('{"done": [1]}', at(1), iid),
                prepare=True,
            )
        # Every release stages events without naming staged_seq: before 0004 it does not
        # exist, from 0004 on its default allocates it.
        await conn.execute(
            "INSERT INTO outbox_event (event_id, instance_id, sequence, ordinal, type, "
            "schema_version, partition_key, payload, staged_at) "
            "VALUES (%s, %s, %s, 0, 'release.happened', '1', %s, %s::json, %s)",
            (eid, iid, seq, iid, '{"e": 1}', at(1)),
            prepare=True,
        )
    if k >= 5:  # release 5 parks a sleeping instance and its wake in one write
        await conn.execute(
            "UPDATE flow_instance SET state = 'Suspended', wake_at = %s, wake_step_id = 2, "
            "wake_scope = '', updated_at = %s WHERE instance_id = %s",
            (at(3600), at(2), iid),
            prepare=True,
        )
    await _read_release(conn, k, iid, eid)
    return iid


async def _read_release(
    conn: psycopg.AsyncConnection[Any], k: int, iid: str, eid: str | None = None
) -> None:
    """Release ``k``'s reads of what it wrote: instance, resume read, outbox, scans."""
    extra = ", state_bag_sequence" if k >= 2 else ""
    extra += ", wake_at, wake_step_id, wake_scope" if k >= 5 else ""
    inst = await (
        await conn.execute(
            "SELECT state, state_bag::text, next_sequence, flow_version" + extra + " "
            "FROM flow_instance WHERE instance_id = %s",
            (iid,),
            prepare=True,
        )
    ).fetchone()
    assert inst is not None
    expected: tuple[Any, ...] = (
        "Suspended" if k >= 5 else "Running",
        '{"done": [1]}',
        2,
        f"{k}.0.0",
    )
    if k >= 2:
        expected += (1,)
    if k >= 5:
        expected += (at(3600), 2, "")
    assert inst == expected
    steps = await (
        await conn.execute(
            "SELECT sequence, step_id, result::text FROM flow_step WHERE instance_id = %s "
            "ORDER BY sequence",
            (iid,),
            prepare=True,
        )
    ).fetchall()
    assert steps == [(1, 1, '"ok"')]
    cols = "event_id::text, payload::text" + (", staged_seq" if k >= 4 else "")
    events = await (
        await conn.execute(
            "SELECT " + cols + " FROM outbox_event WHERE instance_id = %s ORDER BY sequence, "
            "ordinal",
            (iid,),
            prepare=True,
        )
    ).fetchall()
    assert len(events) == 1 and events[0][1] == '{"e": 1}'
    if eid is not None:
        assert events[0][0] == eid
    if k >= 4:
        assert events[0][2] is not None
    by_key = await (
        await conn.execute(
            "SELECT instance_id::text FROM flow_instance WHERE flow_id = 'release.flow' "
            "AND idempotency_key = %s",
            (f"key-{iid}",),
            prepare=True,
        )
    ).fetchall()
    assert by_key == [(iid,)]
    lease = await (
        await conn.execute(
            "SELECT fencing_token FROM flow_lease WHERE instance_id = %s", (iid,), prepare=True
        )
    ).fetchone()
    assert lease == (1,)
    if k < 5:  # still active: the recovery scan of that release finds it once idle
        found = await (
            await conn.execute(
                "SELECT instance_id::text FROM flow_instance "
                "WHERE state IN ('Pending', 'Running', 'Compensating') AND updated_at < %s "
                "ORDER BY updated_at, instance_id LIMIT 1000",
                (at(60),),
                prepare=True,
            )
        ).fetchall()
        assert (iid,) in found
    claim_order = "staged_seq" if k >= 4 else "staged_at"
    async with conn.transaction():
        claimed = await (
            await conn.execute(
                "SELECT event_id::text FROM outbox_event WHERE published_at IS NULL "
                "ORDER BY " + claim_order + " LIMIT 500 FOR UPDATE SKIP LOCKED",
                prepare=True,
            )
        ).fetchall()
        assert (events[0][0],) in claimed


@pytest.mark.parametrize(
    "k", range(1, len(MIGRATIONS)), ids=lambda k: f"release{k}-across-{k + 1:04d}"
)
async def test_each_migration_leaves_the_previous_release_working(
    pg_schema: Callable[[], str], k: int
) -> None:
    """R7.4: release k's statements work before migration k+1 and, unchanged, after it
    (prepared statements survive it too); release k+1's work on the result as well."""
    schema = pg_schema()
    await _new_journal_at(schema, k)
    async with await aconnect(schema) as old_node:
        before = await _run_release(old_node, k)
        await _migrate(schema, k + 1)
        await _read_release(old_node, k, before)  # what it wrote before is still its to read
        await _run_release(old_node, k)  # and it keeps writing, on new ids
        await _run_release(old_node, k)
    async with await aconnect(schema) as new_node:
        await _run_release(new_node, k + 1)
        await _read_release(new_node, k, before)
    with connect(schema) as conn:
        versions = conn.execute("SELECT version FROM flowx_schema_migrations ORDER BY 1")
        assert [v[0] for v in versions.fetchall()] == list(range(1, k + 2))


async def test_migrating_a_populated_version_1_journal_backfills_in_order(
    pg_schema: Callable[[], str],
) -> None:
    """R7.4 expand backfills: 0002 sets state_bag_sequence = max(sequence) for instances with
    a snapshot and steps; 0004 numbers pre-existing outbox rows in staging order."""
    schema = pg_schema()
    await _new_journal_at(schema, 1)
    with_bag, no_bag, no_steps = new_id(), new_id(), new_id()
    with connect(schema) as conn:
        for iid, bag, n_steps in (
            (with_bag, '{"x": 1}', 3),
            (no_bag, "{}", 2),
            (no_steps, '{"y": 2}', 0),
        ):
            conn.execute(
                "INSERT INTO flow_instance (instance_id, flow_id, flow_version, state, fence, "
                "next_sequence, input, state_bag, created_at, updated_at) "
                "VALUES (%s, 'old.flow', '1.0.0', 'Running', 1, %s, '{}', %s::json, %s, %s)",
                (iid, n_steps + 1, bag, T0, T0),
            )
            for s in range(1, n_steps + 1):
                conn.execute(
                    "INSERT INTO flow_step (instance_id, scope, step_id, attempt, sequence, "
                    "step_name, outcome, result, duration_ms, committed_at) "
                    "VALUES (%s, '', %s, 1, %s, 's', 'Success', 'null', 1, %s)",
                    (iid, s, s, at(s)),
                )
        # (instance, sequence, ordinal, staged_at) in staging order, inserted shuffled.
        staged = [
            (no_bag, 1, 0, at(1)),
            (with_bag, 1, 0, at(2)),
            (with_bag, 1, 1, at(2)),
            (with_bag, 1, 2, at(2)),
            (no_bag, 2, 0, at(3)),
            (with_bag, 2, 0, at(4)),
            (with_bag, 3, 0, at(5)),
        ]
        event_ids = [new_id() for _ in staged]
        for i in (4, 0, 6, 2, 5, 1, 3):
            iid, seq, ordinal, when = staged[i]
            conn.execute(
                "INSERT INTO outbox_event (event_id, instance_id, sequence, ordinal, type, "
                "schema_version, payload, staged_at, published_at) "
                "VALUES (%s, %s, %s, %s, 't', '1', '{}', %s, %s)",
                (event_ids[i], iid, seq, ordinal, when, at(9) if i == 0 else None),
            )

    async with open_stores(schema) as stores:  # the real runner: applies 2..N
        assert await stores.schema_version() == SCHEMA_VERSION
        j = stores.journal
        records = {iid: await j.get(iid) for iid in (with_bag, no_bag, no_steps)}
        bags = {iid: r.state_bag_sequence if r else "missing" for iid, r in records.items()}
        assert bags == {with_bag: 3, no_bag: None, no_steps: None}

        with connect(schema) as conn:
            rows = conn.execute(
                "SELECT event_id::text, staged_seq FROM outbox_event ORDER BY staged_seq"
            ).fetchall()
        assert [r[0] for r in rows] == event_ids
        seqs = [r[1] for r in rows]
        assert None not in seqs and len(set(seqs)) == len(seqs)

        # The journal carries on where version 1 left it: sequence 4, a fresh staged_seq.
        committed = await j.commit(
            StepCommit(instance_id=with_bag, token=1, now=at(10), step=step(4), events=(event(),))
        )
        assert committed == 4
        newest = (await j.events(with_bag))[-1]
        assert newest.sequence == 4 and newest.staged_seq > max(seqs)


def _migration_rows(schema: str) -> list[tuple[Any, ...]]:
    with connect(schema) as conn:
        return conn.execute(
            "SELECT version, name, applied_at FROM flowx_schema_migrations ORDER BY version"
        ).fetchall()


async def test_opening_a_migrated_journal_again_applies_nothing(
    pg_schema: Callable[[], str],
) -> None:
    """The runner is idempotent: a second open finds the schema current and writes nothing."""
    schema = pg_schema()
    async with open_stores(schema):
        pass
    first = _migration_rows(schema)
    assert [r[0] for r in first] == list(range(1, SCHEMA_VERSION + 1))
    async with open_stores(schema) as stores:
        assert await stores.schema_version() == SCHEMA_VERSION
    assert _migration_rows(schema) == first
    with connect(schema) as conn:  # the seed was not run twice either
        assert conn.execute("SELECT count(*) FROM retention_policy").fetchone() == (4,)


async def test_nodes_opening_one_fresh_journal_at_once_migrate_it_once(
    pg_schema: Callable[[], str],
) -> None:
    """Several nodes starting together: the advisory lock lets one migrate, the rest wait
    and find the schema current."""
    schema = pg_schema()
    nodes = [PostgresStores(PG_DSN, schema=schema) for _ in range(4)]
    try:
        await asyncio.gather(*(n.open() for n in nodes))
        assert [await n.schema_version() for n in nodes] == [SCHEMA_VERSION] * 4
    finally:
        for n in nodes:
            await n.close()
    assert [r[0] for r in _migration_rows(schema)] == list(range(1, SCHEMA_VERSION + 1))
