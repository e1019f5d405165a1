"""The PostgreSQL schema keeps the journal's contract, checked on the real server
(R2.1 shape, R2.2 append-only, R2.13 retention seed, R3.1 leases). R2.4 (the fence rises on
acquisition) is a conformance test every store runs: flowx.testing.conformance.leases."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import flowx
from flowx.stores.errors import DuplicateStep
from flowx.stores.postgres import PostgresStores
from flowx.stores.postgres.database import SCHEMA_VERSION
from flowx.stores.records import InstanceState, Outcome, StepCommit, StepWrite
from flowx.testing.conformance._support import at, event, instance, new_id, step
from tests.postgres.support import PG_DSN, columns, connect, create_schema, open_stores

TTL = timedelta(seconds=30)

# Payload texts no re-rendering survives: repeated keys, key order, odd spacing, number
# spellings, a \u escape next to the character it stands for, surrounding whitespace.
ODD_INPUT = '{"z": 1,  "a":[1, 2.50], "z": 2}'
ODD_BAG = ' {"b" :2 ,"a":1,"b":3 , "s":"caf\\u00e9 / café"}\n'
ODD_RESULT = '[ 1e2, -0, 12345678901234567890.000 ,{"k":null,"k":true}]'
ODD_NONDET = '{"now" :"2026-03-01T12:00:00Z",  "uuid":"u-1"}'
ODD_EVENT = '{"amount": 10.10,   "amount": 10.1, "when":"2026-03-01T12:00:00Z"}'
ODD_ERROR = '{ "code":"x.y" ,"detail" : [ ] }'


async def test_payloads_are_stored_and_read_byte_for_byte(
    pg_schema: Callable[[], str],
) -> None:
    """R2.1: payload columns hold the text exactly as serialised, through the store's reads
    and in the raw column text."""
    schema = pg_schema()
    async with open_stores(schema) as stores:
        j = stores.journal
        iid = (await j.create(instance(input=ODD_INPUT), token=1, now=at(0))).instance.instance_id
        odd_step = StepWrite(
            scope="",
            step_id=1,
            attempt=1,
            step_name="odd",
            outcome=Outcome.SUCCESS,
            result=ODD_RESULT,
            nondeterministic=ODD_NONDET,
            duration_ms=1,
        )
        seq = await j.commit(
            StepCommit(
                instance_id=iid,
                token=1,
                now=at(1),
                step=odd_step,
                state_bag=ODD_BAG,
                events=(event(payload=ODD_EVENT),),
            )
        )
        assert seq == 1
        await j.commit(
            StepCommit(
                instance_id=iid, token=1, now=at(2), state=InstanceState.FAILED, error=ODD_ERROR
            )
        )

        record = await j.get(iid)
        assert record is not None
        assert (record.input, record.state_bag, record.error) == (ODD_INPUT, ODD_BAG, ODD_ERROR)
        [row] = await j.steps(iid)
        assert (row.result, row.nondeterministic) == (ODD_RESULT, ODD_NONDET)
        [staged] = await j.events(iid)
        assert staged.payload == ODD_EVENT
        history = await j.open(iid, token=2, now=at(3))
        assert history.instance.input == ODD_INPUT and history.instance.state_bag == ODD_BAG
        assert history.steps[0].result == ODD_RESULT

    with connect(schema) as conn:
        raw = conn.execute(
            "SELECT input::text, state_bag::text, error::text FROM flow_instance "
            "WHERE instance_id = %s",
            (iid,),
        ).fetchone()
        assert raw == (ODD_INPUT, ODD_BAG, ODD_ERROR)
        raw = conn.execute(
            "SELECT result::text, nondeterministic::text FROM flow_step WHERE instance_id = %s",
            (iid,),
        ).fetchone()
        assert raw == (ODD_RESULT, ODD_NONDET)
        raw = conn.execute(
            "SELECT payload::text FROM outbox_event WHERE instance_id = %s", (iid,)
        ).fetchone()
        assert raw == (ODD_EVENT,)


async def test_group_committed_payloads_are_stored_byte_for_byte(
    pg_schema: Callable[[], str],
) -> None:
    """R2.1 through the batched statement (R6.2): text[] -> json keeps every byte too."""
    schema = pg_schema()

    def bag(n: int) -> str:
        return f'{{"n": {n},  "n":"{n}" ,"pad":[ 1.0 ]}}'

    def payload(n: int) -> str:
        return f'{{ "e" : {n}, "e": -{n}.50 }}'

    async with open_stores(schema) as stores:
        j = stores.journal
        ids = [
            (await j.create(instance(), token=1, now=at(0))).instance.instance_id for _ in range(40)
        ]
        await asyncio.gather(
            *(
                j.commit(
                    StepCommit(
                        instance_id=iid,
                        token=1,
                        now=at(1),
                        step=step(1, result=payload(n)),
                        state_bag=bag(n),
                        events=(event(key=iid, payload=payload(n)),),
                    )
                )
                for n, iid in enumerate(ids)
            )
        )
        assert j._group.batched_commits > 0  # the batch ran
        for n, iid in enumerate(ids):
            record = await j.get(iid)
            assert record is not None and record.state_bag == bag(n)
            assert [s.result for s in await j.steps(iid)] == [payload(n)]
            assert [e.payload for e in await j.events(iid)] == [payload(n)]
    with connect(schema) as conn:
        rows = conn.execute(
            "SELECT f.instance_id::text, f.state_bag::text, s.result::text, o.payload::text "
            "FROM flow_instance f JOIN flow_step s USING (instance_id) "
            "JOIN outbox_event o USING (instance_id)"
        ).fetchall()
        by_id = {r[0]: r[1:] for r in rows}
        assert by_id == {iid: (bag(n), payload(n), payload(n)) for n, iid in enumerate(ids)}


@pytest.mark.parametrize(
    ("table", "column"),
    [
        ("flow_instance", "input"),
        ("flow_instance", "state_bag"),
        ("flow_instance", "error"),
        ("flow_step", "result"),
        ("flow_step", "nondeterministic"),
        ("outbox_event", "payload"),
        ("flow_signal", "payload"),
    ],
)
async def test_payload_columns_are_json_not_jsonb(
    pg_schema: Callable[[], str], table: str, column: str
) -> None:
    """R2.1: json keeps the text; jsonb would re-render it."""
    schema = pg_schema()
    async with open_stores(schema):
        with connect(schema) as conn:
            assert columns(conn, table)[column][0] == "json"


async def test_the_journal_has_every_table_of_the_spec(pg_schema: Callable[[], str]) -> None:
    """R2.1: flow_instance, flow_step, outbox_event, flow_lease, retention_policy,
    change_cursor."""
    schema = pg_schema()
    async with open_stores(schema):
        with connect(schema) as conn:
            tables = {
                r[0]
                for r in conn.execute(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = current_schema()"
                ).fetchall()
            }
    assert tables >= {
        "flow_instance",
        "flow_step",
        "outbox_event",
        "flow_lease",
        "retention_policy",
        "change_cursor",
        "flowx_schema_migrations",
    }


def _foreign_keys(conn: psycopg.Connection[Any], table: str) -> list[str]:
    rows = conn.execute(
        "SELECT c.conname FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid "
        "JOIN pg_namespace n ON n.oid = t.relnamespace "
        "WHERE n.nspname = current_schema() AND t.relname = %s AND c.contype = 'f'",
        (table,),
    ).fetchall()
    return [r[0] for r in rows]


async def test_a_lease_is_taken_before_its_instance_exists(pg_schema: Callable[[], str]) -> None:
    """R2.1/R3.1: flow_lease has no foreign key to flow_instance."""
    schema = pg_schema()
    async with open_stores(schema) as stores:
        iid = new_id()
        lease = await stores.leases.acquire(iid, owner="node-a", ttl=TTL, now=at(0))
        assert lease is not None and lease.token >= 1
        assert await stores.journal.get(iid) is None  # still no instance row
        created = await stores.journal.create(instance(iid), token=lease.token, now=at(1))
        assert created.created and created.instance.fence == lease.token
        with connect(schema) as conn:
            assert _foreign_keys(conn, "flow_lease") == []
            # The same query does see the FKs the journal's own tables carry.
            assert _foreign_keys(conn, "flow_step") != []
            assert _foreign_keys(conn, "outbox_event") != []


async def test_the_lease_row_survives_release_and_tokens_keep_rising(
    pg_schema: Callable[[], str],
) -> None:
    """R3.1: release and expiry update the row, never delete it; tokens never restart."""
    schema = pg_schema()
    async with open_stores(schema) as stores:
        leases = stores.leases
        iid = (await stores.journal.create(instance(), token=1, now=at(0))).instance.instance_id
        first = await leases.acquire(iid, owner="node-a", ttl=TTL, now=at(1))
        assert first is not None
        await leases.release(first, now=at(5))

        with connect(schema) as conn:
            rows = conn.execute(
                "SELECT fencing_token, expires_at FROM flow_lease WHERE instance_id = %s", (iid,)
            ).fetchall()
        assert len(rows) == 1
        assert rows[0][0] == first.token and rows[0][1] <= at(5)
        current = await leases.current(iid)
        assert current is not None and current.token == first.token

        second = await leases.acquire(iid, owner="node-b", ttl=TTL, now=at(6))
        assert second is not None and second.token > first.token
        # A live lease is not handed out twice.
        assert await leases.acquire(iid, owner="node-c", ttl=TTL, now=at(7)) is None
        # Left to expire, never released: the next token is higher still.
        third = await leases.acquire(iid, owner="node-c", ttl=TTL, now=at(6 + 31))
        assert third is not None and third.token > second.token
        with connect(schema) as conn:
            rows = conn.execute(
                "SELECT owner_node, fencing_token FROM flow_lease WHERE instance_id = %s", (iid,)
            ).fetchall()
        assert rows == [("node-c", third.token)]


@pytest.mark.parametrize(
    "assignment",
    [
        "result = '\"forged\"'::json",
        "outcome = 'Failure'",
        "sequence = sequence + 100",
        "duration_ms = 0",
        "committed_at = committed_at + interval '1 day'",
    ],
)
async def test_a_step_row_cannot_be_updated(pg_schema: Callable[[], str], assignment: str) -> None:
    """R2.2: flow_step is append-only; a raw UPDATE is refused and changes nothing."""
    schema = pg_schema()
    async with open_stores(schema) as stores:
        iid = (await stores.journal.create(instance(), token=1, now=at(0))).instance.instance_id
        await stores.journal.commit(
            StepCommit(instance_id=iid, token=1, now=at(1), step=step(1, result='{"v": 1}'))
        )
        with connect(schema) as conn:
            query = "SELECT row_to_json(s)::text FROM flow_step s WHERE instance_id = %s"
            before = conn.execute(query, (iid,)).fetchall()
            assert len(before) == 1
            with pytest.raises(psycopg.errors.IntegrityConstraintViolation, match="append-only"):
                conn.execute(
                    f"UPDATE flow_step SET {assignment} WHERE instance_id = %s",
                    (iid,),
                )
            assert conn.execute(query, (iid,)).fetchall() == before


async def test_a_duplicate_step_row_raises_duplicate_step(pg_schema: Callable[[], str]) -> None:
    """R2.2: a duplicate key raises DuplicateStep and writes nothing."""
    schema = pg_schema()
    async with open_stores(schema) as stores:
        j = stores.journal
        iid = (await j.create(instance(), token=1, now=at(0))).instance.instance_id
        await j.commit(StepCommit(instance_id=iid, token=1, now=at(1), step=step(1)))
        with pytest.raises(DuplicateStep):
            await j.commit(
                StepCommit(
                    instance_id=iid,
                    token=1,
                    now=at(2),
                    step=step(1, result='"again"'),
                    state_bag='{"after":"dup"}',
                    events=(event(),),
                )
            )
        record = await j.get(iid)
        assert record is not None
        assert (record.next_sequence, record.state_bag) == (2, "{}")
        assert [s.result for s in await j.steps(iid)] == ['"ok"']
        assert list(await j.events(iid)) == []


async def test_duration_ms_is_bigint_end_to_end(pg_schema: Callable[[], str]) -> None:
    """R2.1: duration_ms is bigint (an int overflows at 24.8 days)."""
    schema = pg_schema()
    long_step = StepWrite(
        scope="",
        step_id=1,
        attempt=1,
        step_name="slow",
        outcome=Outcome.SUCCESS,
        result="null",
        duration_ms=40 * 24 * 3600 * 1000,  # forty days
    )
    async with open_stores(schema) as stores:
        iid = (await stores.journal.create(instance(), token=1, now=at(0))).instance.instance_id
        await stores.journal.commit(StepCommit(instance_id=iid, token=1, now=at(1), step=long_step))
        [row] = await stores.journal.steps(iid)
        assert row.duration_ms == 40 * 24 * 3600 * 1000
        with connect(schema) as conn:
            assert columns(conn, "flow_step")["duration_ms"] == ("bigint", "NO")


async def test_step_sequence_is_unique_per_instance(pg_schema: Callable[[], str]) -> None:
    """R2.1: flow_step (instance_id, sequence) is unique: one commit order per instance."""
    schema = pg_schema()
    async with open_stores(schema) as stores:
        iid = (await stores.journal.create(instance(), token=1, now=at(0))).instance.instance_id
        await stores.journal.commit(StepCommit(instance_id=iid, token=1, now=at(1), step=step(1)))
        with connect(schema) as conn:
            keys = conn.execute(
                "SELECT array_agg(a.attname::text ORDER BY k.ord) FROM pg_index i "
                "JOIN pg_class t ON t.oid = i.indrelid "
                "JOIN pg_namespace n ON n.oid = t.relnamespace "
                "CROSS JOIN unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
                "JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum "
                "WHERE n.nspname = current_schema() AND t.relname = 'flow_step' "
                "AND i.indisunique AND i.indpred IS NULL GROUP BY i.indexrelid"
            ).fetchall()
            assert ["instance_id", "sequence"] in [k[0] for k in keys]
            with pytest.raises(psycopg.errors.UniqueViolation):
                conn.execute(
                    "INSERT INTO flow_step (instance_id, scope, step_id, attempt, sequence, "
                    "step_name, outcome, result, duration_ms, committed_at) "
                    "VALUES (%s, '', 2, 1, 1, 'other', 'Success', 'null', 0, now())",
                    (iid,),
                )


async def test_state_bag_sequence_and_wake_columns_exist(pg_schema: Callable[[], str]) -> None:
    """R2.1/R2.11: state_bag_sequence, and wake_at/wake_step_id/wake_scope, all nullable so
    the previous release is untouched."""
    schema = pg_schema()
    async with open_stores(schema) as stores:
        with connect(schema) as conn:
            cols = columns(conn, "flow_instance")
        iid = (await stores.journal.create(instance(), token=1, now=at(0))).instance.instance_id
        await stores.journal.commit(
            StepCommit(instance_id=iid, token=1, now=at(1), step=step(1), state_bag='{"a":1}')
        )
        await stores.journal.commit(
            StepCommit(instance_id=iid, token=1, now=at(2), step=step(2), state_bag='{"a":2}')
        )
        record = await stores.journal.get(iid)
    assert cols["state_bag_sequence"] == ("bigint", "YES")
    assert cols["wake_at"] == ("timestamp with time zone", "YES")
    assert cols["wake_step_id"] == ("integer", "YES")
    assert cols["wake_scope"] == ("text", "YES")
    assert cols["next_sequence"][0] == "bigint"
    assert record is not None and record.state_bag_sequence == 2


async def test_signal_and_replay_columns_and_the_inbox_table(pg_schema: Callable[[], str]) -> None:
    """R2.10 (0007): wake_signal and replay_sequence are nullable (the previous release is
    untouched); flow_signal holds the inbox, one row per (instance, name, key) when a key is
    given, and goes with its instance."""
    schema = pg_schema()
    async with open_stores(schema) as stores:
        iid = (await stores.journal.create(instance(), token=1, now=at(0))).instance.instance_id
        await stores.waits.signal(iid, "go", '{"a": 1}', key="k", now=at(1))
        await stores.waits.signal(iid, "go", '{"a": 2}', key=None, now=at(2))
        await stores.waits.signal(iid, "go", '{"a": 3}', key=None, now=at(3))
        with connect(schema) as conn:
            cols = columns(conn, "flow_instance")
            inbox = columns(conn, "flow_signal")
            with pytest.raises(psycopg.errors.UniqueViolation):
                conn.execute(
                    "INSERT INTO flow_signal (instance_id, name, key, payload, received_at) "
                    "VALUES (%s, 'go', 'k', '{}', now())",
                    (iid,),
                )
            assert conn.execute("SELECT count(*) FROM flow_signal").fetchone() == (3,)
            assert _foreign_keys(conn, "flow_signal") != []
            conn.execute("DELETE FROM flow_instance WHERE instance_id = %s", (iid,))
            assert conn.execute("SELECT count(*) FROM flow_signal").fetchone() == (0,)
    assert cols["wake_signal"] == ("text", "YES")
    assert cols["replay_sequence"] == ("bigint", "YES")
    assert cols["resume_from_step"] == ("integer", "YES")
    assert {k: v[0] for k, v in inbox.items()} == {
        "seq": "bigint",
        "instance_id": "uuid",
        "name": "text",
        "key": "text",
        "payload": "json",
        "received_at": "timestamp with time zone",
    }
    assert inbox["key"][1] == "YES"


async def test_suspended_instances_have_a_partial_wake_index(pg_schema: Callable[[], str]) -> None:
    """R2.1/R2.11: an index over wake_at, partial on state = 'Suspended'."""
    schema = pg_schema()
    async with open_stores(schema):
        with connect(schema) as conn:
            rows = conn.execute(
                "SELECT ic.relname, pg_get_expr(i.indpred, i.indrelid), "
                "(SELECT array_agg(a.attname::text ORDER BY k.ord) "
                "   FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
                "   JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum) "
                "FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid "
                "JOIN pg_class ic ON ic.oid = i.indexrelid "
                "JOIN pg_namespace n ON n.oid = t.relnamespace "
                "WHERE n.nspname = current_schema() AND t.relname = 'flow_instance'"
            ).fetchall()
    wake = [(name, pred) for name, pred, keys in rows if keys and keys[0] == "wake_at"]
    assert wake, f"no index leads with wake_at among {[r[0] for r in rows]}"
    assert any(pred == "(state = 'Suspended'::text)" for _, pred in wake), wake


async def test_retention_policy_is_seeded_with_the_documented_windows(
    pg_schema: Callable[[], str],
) -> None:
    """R2.13: Completed 30 d; Failed 180 d; Suspended never; published outbox rows 7 d, all
    as the '*' default."""
    schema = pg_schema()
    async with open_stores(schema):
        with connect(schema) as conn:
            rows = conn.execute(
                "SELECT flow_id, state_class, retain_for FROM retention_policy"
            ).fetchall()
    assert sorted(rows, key=lambda r: r[1]) == sorted(
        [
            ("*", "Completed", timedelta(days=30)),
            ("*", "Failed", timedelta(days=180)),
            ("*", "Suspended", None),
            ("*", "OutboxPublished", timedelta(days=7)),
        ],
        key=lambda r: r[1],
    )


def _schema_snapshot(schema: str) -> tuple[list[Any], ...]:
    with connect(schema) as conn:
        cols = conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_schema = current_schema() ORDER BY 1, 2"
        ).fetchall()
        indexes = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
            "ORDER BY 1"
        ).fetchall()
        versions = conn.execute(
            "SELECT version, name, applied_at FROM flowx_schema_migrations ORDER BY version"
        ).fetchall()
        data = conn.execute(
            "SELECT (SELECT count(*) FROM flow_instance), (SELECT count(*) FROM retention_policy)"
        ).fetchall()
    return cols, indexes, versions, data


async def test_a_schema_newer_than_the_code_is_refused_and_left_alone(
    pg_schema: Callable[[], str],
) -> None:
    """R7.4: a node never runs against (or "downgrades") a journal a newer FlowX migrated."""
    schema = pg_schema()
    async with open_stores(schema) as stores:
        await stores.journal.create(instance(), token=1, now=at(0))
    with connect(schema) as conn:
        conn.execute(
            "INSERT INTO flowx_schema_migrations (version, name) VALUES (%s, 'from_the_future')",
            (SCHEMA_VERSION + 1,),
        )
    before = _schema_snapshot(schema)
    stores = PostgresStores(PG_DSN, schema=schema)
    with pytest.raises(flowx.SchemaTooNew) as refused:
        await stores.open()
    assert (refused.value.found, refused.value.known) == (SCHEMA_VERSION + 1, SCHEMA_VERSION)
    assert _schema_snapshot(schema) == before


async def test_a_schema_holding_foreign_tables_is_refused_and_left_alone(
    pg_schema: Callable[[], str],
) -> None:
    """R2.1: a schema with foreign tables and no flowx_schema_migrations is not a journal:
    NotAFlowXStore, and nothing in it changes."""
    schema = pg_schema()
    create_schema(schema)
    with connect(schema) as conn:
        conn.execute("CREATE TABLE orders (id integer PRIMARY KEY, note text)")
        conn.execute("INSERT INTO orders VALUES (1, 'keep me'), (2, 'me too')")
    stores = PostgresStores(PG_DSN, schema=schema)
    with pytest.raises(flowx.NotAFlowXStore):
        await stores.open()
    with connect(schema) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchall()
        assert tables == [("orders",)]
        assert conn.execute("SELECT id, note FROM orders ORDER BY id").fetchall() == [
            (1, "keep me"),
            (2, "me too"),
        ]
        assert columns(conn, "orders") == {"id": ("integer", "NO"), "note": ("text", "YES")}
