"""R6.3: suspended instances cost storage, not compute.

100,000 Suspended instances sit in a real PostgreSQL journal; a worker opens on it and runs its
timer service and recovery scan. It takes the 200 that are due and nothing else: no task, no
lease, no memory for the rest. (The timer query's plan — an index range scan of
``flow_instance_wake_idx``, no sort — is pinned in ``test_query_plans.py``.)
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from pydantic import BaseModel

import flowx
from tests.postgres_support import PG_DSN

pytestmark = pytest.mark.timeout(120)

SUSPENDED = 100_000
DUE = 200


class Nap(BaseModel):
    n: int = 0


class NapState(BaseModel):
    woke: str | None = None


@flowx.capability("cost.wake", version="1.0.0")
async def wake(ctx: flowx.StepContext, nap: Nap) -> str:
    return "awake"


nap_flow = (
    flowx.flow("cost.nap", version="1", input=Nap, state=NapState)
    .sleep("1d", name="nap")
    .step(wake, into="woke")
    .build()
)


def _park(schema: str, now: datetime) -> None:
    """Write the sleepers straight into the journal: as a run would have left them (sealed
    at step 1, the sleep), minus the hours it would take to run 100,000 flows here."""
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')  # type: ignore[arg-type]
        conn.execute(
            """
            INSERT INTO flow_instance (instance_id, flow_id, flow_version, state, fence,
                input, state_bag, created_at, updated_at, wake_at, wake_step_id, wake_scope)
            SELECT gen_random_uuid(), 'cost.nap', '1', 'Suspended', 1, '{"n":0}',
                   '{"woke":null}', %(now)s, %(now)s,
                   CASE WHEN g <= %(due)s THEN %(now)s - interval '1 minute'
                        ELSE %(now)s + interval '1 day' END,
                   1, ''
              FROM generate_series(1, %(total)s) AS g
            """,
            {"now": now, "due": DUE, "total": SUSPENDED},
        )
        conn.execute("ANALYZE flow_instance")


async def test_a_hundred_thousand_suspended_instances_cost_a_worker_nothing(
    pg_schema: Callable[[], str],
) -> None:
    schema = pg_schema()
    store = flowx.postgres(PG_DSN, schema=schema)
    await store.open()  # migrate
    await store.close()
    now = datetime.now(UTC)
    _park(schema, now)

    gc.collect()
    tracemalloc.start()
    settings = flowx.HostSettings(timer_batch_size=500, max_concurrent_flows=1_000)
    host = flowx.FlowHost(
        store=flowx.postgres(PG_DSN, schema=schema),
        flows=[nap_flow],
        settings=settings.replace(recovery=False, timers=False),
    )
    await host.open()
    try:
        baseline_tasks = len(asyncio.all_tasks())
        before, _ = tracemalloc.get_traced_memory()

        sweep = await host.timers.run_once()
        assert sweep.due == DUE and sweep.woken == DUE
        assert sweep.next_wake is not None and sweep.next_wake > now + timedelta(hours=23)
        await host.wait_idle(timeout=60)
        assert (await host.timers.run_once()).due == 0  # nothing else is due: nothing taken
        scan = await host.recover_once()  # Suspended is not a recovery candidate either
        assert scan.found == 0

        assert host.in_flight == 0
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
        # 100,000 instances at even 100 bytes each would be 10 MB; what the worker holds
        # after waking 200 of them is what it held before, give or take its caches.
        print(f"traced memory grew by {(after - before) / 1e6:.2f} MB")
        assert after - before < 4 * 1024 * 1024, f"grew by {(after - before) / 1e6:.1f} MB"
        assert len(asyncio.all_tasks()) <= baseline_tasks
    finally:
        await host.drain(timeout=5)
        tracemalloc.stop()

    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')  # type: ignore[arg-type]
        rows = conn.execute(
            "SELECT state, count(*) FROM flow_instance GROUP BY state ORDER BY state"
        ).fetchall()
        leases = conn.execute("SELECT count(*) FROM flow_lease").fetchone()
    assert dict(rows) == {"Completed": DUE, "Suspended": SUSPENDED - DUE}
    assert leases == (DUE,)  # a lease was taken for each woken instance, none for the rest
