"""The SQLite store's own contract: what a file is, what a schema is, and what cannot change.

The behaviour every store shares is in tests/conformance; this is what only a file has.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import flowx
from flowx.stores.records import StepCommit
from flowx.stores.sqlite import SqliteStores
from flowx.stores.sqlite.database import APPLICATION_ID, SCHEMA_VERSION
from flowx.testing.conformance._support import at, instance, step


async def test_a_new_file_is_created_migrated_and_marked(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    stores = SqliteStores(path)
    await stores.open()
    await stores.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    versions = [r[0] for r in conn.execute("SELECT version FROM flowx_schema_migrations")]
    assert versions == list(range(1, SCHEMA_VERSION + 1))
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {
        "flow_instance",
        "flow_step",
        "outbox_event",
        "flow_lease",
        "retention_policy",
        "change_cursor",
    } <= tables


async def test_reopening_a_journal_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    first = SqliteStores(path)
    await first.open()
    created = await first.journal.create(instance(), token=1, now=at(0))
    await first.close()
    second = SqliteStores(path)
    await second.open()
    assert await second.journal.get(created.instance.instance_id) == created.instance
    await second.close()


async def test_a_file_that_is_not_a_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"shopping list: eggs, milk\n" * 100)
    before = path.read_bytes()
    with pytest.raises(flowx.NotAFlowXStore, match="not an SQLite database"):
        await SqliteStores(path).open()
    assert path.read_bytes() == before


async def test_another_applications_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO customers (name) VALUES ('ada')")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(flowx.NotAFlowXStore, match="not a FlowX journal"):
        await SqliteStores(path).open()
    assert path.read_bytes() == before


async def test_a_schema_newer_than_the_code_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    stores = SqliteStores(path)
    await stores.open()
    await stores.close()
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO flowx_schema_migrations VALUES (?, 'from_the_future', 'x')",
        (SCHEMA_VERSION + 1,),
    )
    conn.commit()
    conn.close()
    with pytest.raises(flowx.SchemaTooNew) as refused:
        await SqliteStores(path).open()
    assert (refused.value.found, refused.value.known) == (SCHEMA_VERSION + 1, SCHEMA_VERSION)
    assert "upgrade FlowX" in refused.value.message


async def test_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(flowx.JournalUnavailable, match="does not exist"):
        await SqliteStores(tmp_path / "no" / "such" / "dir" / "x.db").open()


async def test_a_step_row_cannot_be_updated(tmp_path: Path) -> None:
    """R2.2 is enforced by the schema, not only by the code that happens to use it."""
    path = tmp_path / "j.db"
    stores = SqliteStores(path)
    await stores.open()
    iid = (await stores.journal.create(instance(), token=1, now=at(0))).instance.instance_id
    await stores.journal.commit(StepCommit(instance_id=iid, token=1, now=at(1), step=step(1)))
    await stores.close()
    conn = sqlite3.connect(path)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("UPDATE flow_step SET result = '\"forged\"' WHERE instance_id = ?", (iid,))
    assert conn.execute("SELECT result FROM flow_step").fetchone()[0] == '"ok"'


async def test_the_recovery_scan_reads_its_index_in_order(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    stores = SqliteStores(path)
    await stores.open()
    await stores.close()
    conn = sqlite3.connect(path)
    plan = conn.execute(
        "EXPLAIN QUERY PLAN SELECT instance_id FROM flow_instance "
        "INDEXED BY flow_instance_abandoned_idx "
        "WHERE state IN ('Pending', 'Running', 'Compensating') "
        "AND (state = 'Pending' OR updated_at < ?) ORDER BY updated_at, instance_id LIMIT 10",
        ("2026",),
    ).fetchall()
    details = " ".join(str(r[-1]) for r in plan)
    assert "flow_instance_abandoned_idx" in details


_CONTENDER = r"""
import asyncio, sys
from datetime import datetime, timedelta, UTC
from flowx.stores.sqlite import SqliteStores

async def main():
    s = SqliteStores(sys.argv[1]); await s.open()
    won = 0
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(int(sys.argv[2])):
        if await s.leases.acquire(f"i-{i}", owner=sys.argv[3], ttl=timedelta(hours=1), now=now):
            won += 1
    await s.close()
    print(won)

asyncio.run(main())
"""


def test_several_processes_never_share_a_lease(tmp_path: Path) -> None:
    """R1.2: one file, several worker processes; each lease goes to exactly one of them."""
    path = tmp_path / "shared.db"
    asyncio.run(_init(path))
    n = 200
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CONTENDER, str(path), str(n), f"p{k}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for k in range(3)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1].decode() for o in outputs]
    assert sum(int(o[0]) for o in outputs) == n
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*), max(fencing_token) FROM flow_lease").fetchone() == (n, 1)


async def _init(path: Path) -> None:
    stores = SqliteStores(path)
    await stores.open()
    await stores.close()


async def test_a_value_sqlite_refuses_fails_alone_and_its_batch_commits_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R9.5: one write in a group commit whose data the driver refuses (a lone surrogate, as
    a codec gap would let through) is rolled back to its savepoint alone; every neighbour in
    the same BEGIN ... COMMIT commits untouched, exactly once."""
    stores = SqliteStores(tmp_path / "batch.db")
    await stores.open()
    try:
        j = stores.journal
        ids = [
            (await j.create(instance(), token=1, now=at(0))).instance.instance_id for _ in range(20)
        ]
        sizes: list[int] = []
        real = stores.db._write_batch

        def spy(batch: Any) -> Any:
            sizes.append(len(batch))
            return real(batch)

        monkeypatch.setattr(stores.db, "_write_batch", spy)
        bad = 7
        results = await asyncio.gather(
            *(
                j.commit(
                    StepCommit(
                        instance_id=iid,
                        token=1,
                        now=at(1),
                        step=step(1, result='"\ud800"' if n == bad else f'{{"n":{n}}}'),
                        state_bag=f'{{"n":{n}}}',
                    )
                )
                for n, iid in enumerate(ids)
            ),
            return_exceptions=True,
        )
        assert sizes == [len(ids)]  # one BEGIN ... COMMIT held the culprit and its neighbours
        assert isinstance(results[bad], UnicodeEncodeError)
        culprit = await j.get(ids[bad])
        assert culprit is not None and (culprit.next_sequence, culprit.state_bag) == (1, "{}")
        assert list(await j.steps(ids[bad])) == []
        for n, (iid, outcome) in enumerate(zip(ids, results, strict=True)):
            if n == bad:
                continue
            assert outcome == 1, (n, outcome)
            record = await j.get(iid)
            assert record is not None
            assert (record.next_sequence, record.state_bag) == (2, f'{{"n":{n}}}')
            assert [s.result for s in await j.steps(iid)] == [f'{{"n":{n}}}']
    finally:
        await stores.close()
