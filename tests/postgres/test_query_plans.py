"""The hot queries are served by the indexes built for them, with no sort (R3.4, R5.2, R2.8,
R2.11).

One journal per module, with 100,000 instances (mostly Completed, some idle Running, some
Pending, some Suspended), a few instances' histories committed interleaved (as concurrent
instances commit) and a few thousand outbox rows, mostly published. Plans are read with
``EXPLAIN (FORMAT JSON)``, both as a first execution plans them (custom plan, the parameter
values known) and as a long-lived pooled connection runs them once psycopg has prepared them
(generic plan).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, NamedTuple

import psycopg
import pytest

from flowx.stores.postgres.claims import CLAIM_PLAN, CLAIM_QUEUED
from flowx.stores.postgres.retention import EXPIRED as RETENTION_EXPIRED
from flowx.stores.postgres.stops import LOCK_TREE
from flowx.stores.postgres.store import (
    FIND_ABANDONED,
    FIND_QUEUED,
    RESUME_READ_PLAN,
    SELECT_STEPS,
)
from flowx.stores.postgres.waits import FIND_DUE, FIND_DUE_CARRIED, NEXT_WAKE
from flowx.testing.conformance._support import T0
from tests.postgres.support import (
    connect,
    drop_schema,
    index_names,
    new_schema_name,
    node_types,
    open_stores,
    plan_nodes,
)

#: The publisher's claim, as R5.2 words it.
OUTBOX_CLAIM = (
    "SELECT event_id FROM outbox_event WHERE published_at IS NULL "
    "ORDER BY staged_seq LIMIT 500 FOR UPDATE SKIP LOCKED"
)
INSTANCES = 100_000
HISTORIES, STEPS_EACH = 50, 100  # 5,000 step rows: ANALYZE reads them all, stable stats
OUTBOX_INSTANCES, EVENTS_EACH = 500, 10
TTL = timedelta(seconds=30)


class Journal(NamedTuple):
    schema: str
    history_id: str  # an instance with STEPS_EACH step rows


def _build(conn: psycopg.Connection[Any]) -> str:
    # n % 100: 0..89 Completed, 90..94 Running, 95..96 Pending, 97..99 Suspended. Everything
    # was last written long before T0 (idle), oldest first by n.
    conn.execute(
        """
        INSERT INTO flow_instance (instance_id, flow_id, flow_version, tenant_id, state, fence,
                                   next_sequence, input, state_bag, created_at, updated_at,
                                   wake_at, wake_step_id, wake_scope)
        SELECT gen_random_uuid(), 'plan.flow', '1.0.0', 't-' || mod(n, 7),
               CASE WHEN mod(n, 100) < 90 THEN 'Completed'
                    WHEN mod(n, 100) < 95 THEN 'Running'
                    WHEN mod(n, 100) < 97 THEN 'Pending'
                    ELSE 'Suspended' END,
               1, 1, '{"order_id":"o"}', '{}',
               %(t0)s - make_interval(secs => 400000 - n),
               %(t0)s - make_interval(secs => 200000 - n),
               CASE WHEN mod(n, 100) >= 97 THEN %(t0)s + make_interval(secs => n) END,
               CASE WHEN mod(n, 100) >= 97 THEN 3 END,
               CASE WHEN mod(n, 100) >= 97 THEN '' END
          FROM generate_series(1, %(n)s) AS n
        """,
        {"t0": T0, "n": INSTANCES},
    )
    # A few histories, committed the way concurrent instances commit: interleaved.
    conn.execute(
        """
        INSERT INTO flow_step (instance_id, scope, step_id, attempt, sequence, step_name,
                               outcome, result, capability_id, capability_version,
                               duration_ms, committed_at)
        SELECT i.instance_id, '', s, 1, s, 'step-' || s, 'Success', '{"ok":true}', 'cap', '1',
               3, i.updated_at + make_interval(secs => s)
          FROM (SELECT instance_id, updated_at FROM flow_instance
                 WHERE state = 'Running' ORDER BY updated_at LIMIT %(h)s) AS i,
               generate_series(1, %(s)s) AS s
         ORDER BY s, i.updated_at
        """,
        {"h": HISTORIES, "s": STEPS_EACH},
    )
    conn.execute(
        "UPDATE flow_instance SET next_sequence = %s + 1 "
        "WHERE instance_id IN (SELECT DISTINCT instance_id FROM flow_step)",
        (STEPS_EACH,),
    )
    # The outbox: every twentieth event still pending.
    conn.execute(
        """
        INSERT INTO outbox_event (event_id, instance_id, sequence, ordinal, type,
                                  schema_version, partition_key, payload, staged_at,
                                  published_at)
        SELECT gen_random_uuid(), i.instance_id, 1, e, 'plan.happened', '1', 'k-' || mod(e, 7),
               '{"n":1}', i.updated_at,
               CASE WHEN mod(e + i.rn, 20) <> 0 THEN i.updated_at + interval '1 second' END
          FROM (SELECT instance_id, updated_at, row_number() OVER (ORDER BY updated_at) AS rn
                  FROM flow_instance WHERE state = 'Completed'
                 ORDER BY updated_at LIMIT %(i)s) AS i,
               generate_series(0, %(e)s - 1) AS e
         ORDER BY i.updated_at, e
        """,
        {"i": OUTBOX_INSTANCES, "e": EVENTS_EACH},
    )
    conn.execute("ANALYZE")
    row = conn.execute("SELECT instance_id::text FROM flow_step LIMIT 1").fetchone()
    assert row is not None
    return str(row[0])


async def _migrate(schema: str) -> None:
    async with open_stores(schema):
        pass


@pytest.fixture(scope="module")
def journal() -> Iterator[Journal]:
    """A module's own populated schema, migrated by the real runner, dropped at the end."""
    schema = new_schema_name("flowx_plans")
    try:
        asyncio.run(_migrate(schema))
        with connect(schema) as conn:
            history_id = _build(conn)
            counts = conn.execute(
                "SELECT (SELECT count(*) FROM flow_instance), (SELECT count(*) FROM flow_step), "
                "(SELECT count(*) FROM outbox_event), "
                "(SELECT count(*) FROM outbox_event WHERE published_at IS NULL)"
            ).fetchone()
        assert counts == (
            INSTANCES,
            HISTORIES * STEPS_EACH,
            OUTBOX_INSTANCES * EVENTS_EACH,
            OUTBOX_INSTANCES * EVENTS_EACH // 20,
        )
        yield Journal(schema, history_id)
    finally:
        drop_schema(schema)


def _dollars(query: str) -> str:
    numbers = iter(range(1, 1000))
    return re.sub(r"%[sb]", lambda _: f"${next(numbers)}", query)


def explain(
    schema: str, query: str, params: tuple[Any, ...], *, generic: bool, setup: str | None = None
) -> Any:
    """The JSON plan of ``query``: the custom plan of a first execution, or the generic plan a
    prepared statement settles on. ``setup`` is a session statement the store runs first."""
    row: psycopg.Cursor[Any]
    with connect(schema) as conn:
        if setup is not None:
            conn.execute(setup.replace("SET LOCAL", "SET").encode())
        if generic:
            conn.execute("SET plan_cache_mode = force_generic_plan")
            conn.execute(("PREPARE hot AS " + _dollars(query)).encode())
            args = "(" + ", ".join(["%s"] * len(params)) + ")" if params else ""
            row = psycopg.ClientCursor(conn).execute(
                ("EXPLAIN (FORMAT JSON) EXECUTE hot" + args).encode(), params
            )
        else:
            row = conn.execute(("EXPLAIN (FORMAT JSON) " + query).encode(), params)
        found = row.fetchone()
        assert found is not None
        return found[0]


def assert_served_by(plan: Any, *indexes: str) -> None:
    found = index_names(plan)
    assert found & set(indexes), f"expected one of {indexes}, plan uses {found}: {plan}"
    sorts = [t for t in node_types(plan) if "Sort" in t]
    assert sorts == [], f"plan sorts ({sorts}): {plan}"


# --------------------------------------------------------------------------- the helper


def test_the_plan_walker_finds_nested_nodes_and_indexes() -> None:
    """The helper sees a Sort or an index however deep it sits (so the checks can fail)."""
    plan = [
        {
            "Plan": {
                "Node Type": "Limit",
                "Plans": [
                    {
                        "Node Type": "Sort",
                        "Plans": [
                            {
                                "Node Type": "Bitmap Heap Scan",
                                "Plans": [
                                    {"Node Type": "Bitmap Index Scan", "Index Name": "some_idx"}
                                ],
                            }
                        ],
                    },
                    {"Node Type": "Index Scan", "Index Name": "other_idx"},
                ],
            }
        }
    ]
    assert node_types(plan) == [
        "Limit",
        "Sort",
        "Bitmap Heap Scan",
        "Bitmap Index Scan",
        "Index Scan",
    ]
    assert index_names(plan) == {"some_idx", "other_idx"}
    assert len(list(plan_nodes(plan))) == 5
    with pytest.raises(AssertionError, match="plan sorts"):
        assert_served_by(plan, "some_idx")
    with pytest.raises(AssertionError, match="expected one of"):
        assert_served_by([{"Plan": {"Node Type": "Seq Scan"}}], "some_idx")


# --------------------------------------------------------------------------- the plans

PLANS = pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])


@PLANS
@pytest.mark.parametrize("offset", [0, 2_000])
def test_the_recovery_scan_reads_its_partial_index_without_sorting(
    journal: Journal, generic: bool, offset: int
) -> None:
    """R3.4: the abandoned-instance page is a range scan of flow_instance_abandoned_idx (no
    top-N sort), from any offset."""
    plan = explain(journal.schema, FIND_ABANDONED, (T0, TTL, 100, offset), generic=generic)
    assert_served_by(plan, "flow_instance_abandoned_idx")


@PLANS
def test_the_recovery_scan_on_the_servers_clock_reads_its_partial_index(
    journal: Journal, generic: bool
) -> None:
    """R3.4, R9.2: as production sends it — the cutoff on the server's clock (every row due)
    — the page is still a range scan of flow_instance_abandoned_idx, no sort."""
    plan = explain(journal.schema, FIND_ABANDONED, (None, TTL, 100, 0), generic=generic)
    assert_served_by(plan, "flow_instance_abandoned_idx")


@PLANS
def test_the_queued_scan_reads_its_partial_index_without_sorting(
    journal: Journal, generic: bool
) -> None:
    """R3.4: queued (Pending) instances come from flow_instance_queued_idx, no sort."""
    plan = explain(journal.schema, FIND_QUEUED, (100, 0), generic=generic)
    assert_served_by(plan, "flow_instance_queued_idx")


@PLANS
def test_the_outbox_claim_reads_the_pending_index_in_staging_order(
    journal: Journal, generic: bool
) -> None:
    """R5.2: ORDER BY staged_seq LIMIT 500 FOR UPDATE SKIP LOCKED walks
    outbox_event_pending_idx; no sort."""
    plan = explain(journal.schema, OUTBOX_CLAIM, (), generic=generic)
    assert_served_by(plan, "outbox_event_pending_idx")
    assert "LockRows" in node_types(plan)


@PLANS
def test_the_resume_read_follows_a_flow_step_index_without_sorting(
    journal: Journal, generic: bool
) -> None:
    """R2.8: the resume read returns one instance's rows in commit order from an index on
    flow_step, with no Sort node."""
    plan = explain(
        journal.schema,
        SELECT_STEPS,
        (journal.history_id,),
        generic=generic,
        setup=RESUME_READ_PLAN,
    )
    assert_served_by(plan, "flow_step_pkey", "flow_step_sequence_key")


def test_the_resume_read_returns_rows_in_commit_order(journal: Journal) -> None:
    """R2.8: whatever the plan, the rows come back ordered by sequence, all of them."""
    with connect(journal.schema) as conn:
        rows = conn.execute(SELECT_STEPS, (journal.history_id,)).fetchall()
    assert [r[4] for r in rows] == list(range(1, STEPS_EACH + 1))


@PLANS
@pytest.mark.parametrize("due_after", [50_000, 1_000_000], ids=["half-due", "all-due"])
def test_the_timer_scan_reads_the_wake_index_in_wake_order(
    journal: Journal, generic: bool, due_after: int
) -> None:
    """R2.11: the due list (Suspended, wake_at <= now, earliest first, bounded) is a range
    scan of flow_instance_wake_idx, whether some or all of the sleepers are due; no sort."""
    plan = explain(
        journal.schema, FIND_DUE, (T0 + timedelta(seconds=due_after), 100), generic=generic
    )
    assert_served_by(plan, "flow_instance_wake_idx")


@PLANS
@pytest.mark.parametrize("due_after", [50_000, 1_000_000], ids=["half-due", "all-due"])
def test_the_timer_scan_for_carried_flows_reads_the_wake_index_too(
    journal: Journal, generic: bool, due_after: int
) -> None:
    """R2.11, R7.3: the query a node really sends — only the flows it carries — is the same
    range scan of flow_instance_wake_idx, the carried refs a filter on it; no sort."""
    now = T0 + timedelta(seconds=due_after)
    plan = explain(
        journal.schema,
        FIND_DUE_CARRIED,
        (now, ["plan.flow@1.0.0", "other@2"], 100),
        generic=generic,
    )
    assert_served_by(plan, "flow_instance_wake_idx")
    with connect(journal.schema) as conn:
        carried = conn.execute(FIND_DUE_CARRIED, (now, ["plan.flow@1.0.0"], 100)).fetchall()
        elsewhere = conn.execute(FIND_DUE_CARRIED, (now, ["other@2"], 100)).fetchall()
    assert len(carried) == 100 and elsewhere == []


@PLANS
def test_the_next_wake_reads_the_first_entry_of_the_wake_index(
    journal: Journal, generic: bool
) -> None:
    """R2.11: the earliest wake of any Suspended instance is one probe of
    flow_instance_wake_idx, not an aggregate over the table."""
    plan = explain(journal.schema, NEXT_WAKE, (), generic=generic)
    assert_served_by(plan, "flow_instance_wake_idx")
    assert "Seq Scan" not in node_types(plan)


def test_the_timer_scan_returns_due_sleepers_earliest_first(journal: Journal) -> None:
    """R2.11: whatever the plan, only due Suspended rows, in wake_at order, at most the limit,
    starting from the earliest."""
    now = T0 + timedelta(seconds=50_000)
    with connect(journal.schema) as conn:
        rows = conn.execute(FIND_DUE, (now, 100)).fetchall()
        wake_of = dict(
            conn.execute(
                "SELECT instance_id::text, wake_at FROM flow_instance "
                "WHERE instance_id = ANY(%s::uuid[])",
                ([r[0] for r in rows],),
            ).fetchall()
        )
        first = conn.execute(NEXT_WAKE).fetchone()
    wakes = [wake_of[str(r[0])] for r in rows]
    assert len(rows) == 100
    assert {r[3] for r in rows} == {"Suspended"}
    assert wakes == sorted(wakes) and wakes[-1] <= now
    assert first is not None and wakes[0] == first[0]


def _by_position(query: str, named: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
    """``query`` with each ``%(name)s`` (or ``%(name)b``) as ``%s``, its values in order."""
    values: list[Any] = []

    def one(match: re.Match[str]) -> str:
        values.append(named[match.group(1)])
        return "%s"

    return re.sub(r"%\((\w+)\)[sb]", one, query), tuple(values)


@PLANS
@pytest.mark.parametrize("flows", [None, ["plan.flow@1.0.0"]], ids=["any-flow", "carried"])
def test_the_queue_claim_walks_the_queued_index_without_sorting(
    journal: Journal, generic: bool, flows: list[str] | None
) -> None:
    """R3.4 (issue 14): the claim of a page of queued instances reads flow_instance_queued_idx
    in order, locks what it takes (SKIP LOCKED), and sorts nothing."""
    named = {"now": T0, "flows": flows, "limit": 100, "owner": "n1", "ttl": TTL}
    query, params = _by_position(CLAIM_QUEUED, named)
    plan = explain(journal.schema, query, params, generic=generic, setup=CLAIM_PLAN)
    assert_served_by(plan, "flow_instance_queued_idx")
    assert "LockRows" in node_types(plan)


@PLANS
def test_a_stop_request_finds_the_tree_through_the_parent_index(
    journal: Journal, generic: bool
) -> None:
    """R9.4: a cancel reaches an instance's descendants through flow_instance_parent_idx, not
    by scanning the 100,000 instances per level of the tree."""
    query = LOCK_TREE.replace("%(instance_id)s", "%s")
    plan = explain(journal.schema, query, (journal.history_id,), generic=generic)
    assert "flow_instance_parent_idx" in index_names(plan), plan
    assert "Seq Scan" not in node_types(plan), plan


@PLANS
def test_the_retention_page_walks_the_ended_index_without_sorting(
    journal: Journal, generic: bool
) -> None:
    """R2.13: a sweep page is a range scan of flow_instance_ended_idx in (updated_at,
    instance_id) order, however many ended instances the journal holds."""
    query = re.sub(r"%\((\w+)\)([sb])", r"%\2", RETENTION_EXPIRED)
    params = (["Completed"], T0, None, [], None, None, None, None, 500)
    plan = explain(journal.schema, query, params, generic=generic)
    assert "flow_instance_ended_idx" in index_names(plan), plan
    scans = [(n.get("Node Type"), n.get("Relation Name")) for n in plan_nodes(plan)]
    assert ("Seq Scan", "flow_instance") not in scans, plan
    assert ("Seq Scan", "outbox_event") not in scans, plan
    # The one sort allowed: the least change cursor, over the handful of declared consumers.
    for node in plan_nodes(plan):
        if "Sort" in str(node.get("Node Type")):
            below = {n.get("Relation Name") for n in plan_nodes([{"Plan": node}])} - {None}
            assert below == {"change_cursor"}, plan
