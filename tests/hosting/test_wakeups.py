"""Wake-ups, not sweeps: work made by another process reaches an idle worker at once.

A ``flowx start`` or ``flowx signal`` run as its own process (a real second process, on the
same SQLite file or PostgreSQL schema) makes an instance ``Pending``; the worker here sweeps
only every ten minutes, so the instance finishes within the test's bound only if the store's
wake-up (PostgreSQL LISTEN/NOTIFY, SQLite ``data_version``) reached it. How fast is measured by
``benchmarks/wakeups.py``, never asserted here.

The store-level tests check the ``WorkWakeups`` contract itself on both stores: what wakes a
waiter, and that a process's own writes on SQLite do not.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path

import pytest

import flowx
from flowx.stores.protocols import Stores, WorkWakeups
from flowx.stores.records import InstanceState
from tests.cli.wait_flows import FLOWS, Order, shipping
from tests.engine.kit import until_state
from tests.postgres_support import PG_DSN

ROOT = Path(__file__).resolve().parents[2]
#: Sweeps this far apart never find the work within a test's bound: only a wake-up can.
NEVER = timedelta(minutes=10)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path, pg_schema: Callable[[], str]) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'flowx.db'}"
    return f"{PG_DSN}?flowx_schema={pg_schema()}"


@pytest.fixture
async def worker(store_url: str) -> AsyncIterator[flowx.FlowHost]:
    """A worker whose recovery sweep and timer poll are ten minutes apart."""
    settings = flowx.HostSettings.load().replace(
        recovery=True, timers=True, recovery_scan_interval=NEVER, timer_poll_interval=NEVER
    )
    host = flowx.FlowHost(store=flowx.from_url(store_url), flows=FLOWS, settings=settings)
    await host.open()
    yield host
    await host.drain(timeout=5)


def cli(store_url: str, *args: str) -> str:
    """Run ``flowx`` as its own process; its standard output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", "flowx.cli.main", *args, "--db", store_url,
         "--flows", "tests.cli.wait_flows:FLOWS"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.timeout(90)
async def test_a_start_from_another_process_runs_without_waiting_for_a_sweep(
    worker: flowx.FlowHost, store_url: str
) -> None:
    order = '{"order_id": "w1"}'
    out = await asyncio.to_thread(cli, store_url, "start", "cli.mail", "--input", order)
    await until_state(worker, out.strip(), InstanceState.COMPLETED, timeout=30)


@pytest.mark.timeout(90)
async def test_a_signal_from_another_process_resumes_without_waiting_for_a_sweep(
    worker: flowx.FlowHost, store_url: str
) -> None:
    handle = await worker.start(shipping, Order(order_id="w2"))
    await until_state(worker, handle.instance_id, InstanceState.SUSPENDED, timeout=30)
    payload = '{"carrier": "c", "tracking": "t"}'
    await asyncio.to_thread(
        cli, store_url, "signal", handle.instance_id, "shipped", "--payload", payload
    )
    await until_state(worker, handle.instance_id, InstanceState.COMPLETED, timeout=30)


# -- the WorkWakeups contract, on each store ------------------------------------------------


@pytest.fixture
async def pair(store_url: str) -> AsyncIterator[tuple[Stores, Stores]]:
    """Two store objects on one journal: two processes, as far as the journal can tell."""
    stores = (flowx.from_url(store_url), flowx.from_url(store_url))
    for s in stores:
        await s.open()
    yield stores
    for s in stores:
        await s.close()


async def _create_pending(stores: Stores, order_id: str) -> str:
    from flowx import codec
    from flowx.hosting.creation import instance_id_for, new_instance

    value = Order(order_id=order_id)
    new = new_instance(
        shipping, value, codec.dumps(value, root="input"),
        instance_id=instance_id_for(shipping, None), idempotency_key=None,
        correlation_id=None, run_here=False, now=flowx.SystemClock().now(),
    )  # fmt: skip
    await stores.journal.create(new, token=0, now=None)
    return new.instance_id


async def test_a_queued_start_elsewhere_wakes_a_waiting_worker(
    pair: tuple[Stores, Stores],
) -> None:
    here, there = pair
    assert isinstance(here, WorkWakeups)
    # The first look subscribes (LISTEN) or learns where the journal stands (data_version).
    await here.wait_work(0.0)
    waiting = asyncio.create_task(here.wait_work(30.0))
    await _create_pending(there, "c1")
    assert await waiting  # False only after 30 s without a wake-up


async def test_on_sqlite_a_processes_own_writes_do_not_wake_it(
    pair: tuple[Stores, Stores], store_url: str
) -> None:
    if not store_url.startswith("sqlite"):
        pytest.skip("PostgreSQL notifies by what was written, not by who wrote it")
    here, there = pair
    assert isinstance(here, WorkWakeups)
    await here.wait_work(0.0)
    await _create_pending(here, "own")
    assert not await here.wait_work(0.05)
    await _create_pending(there, "theirs")
    assert await here.wait_work(30.0)


@pytest.mark.timeout(90)
async def test_a_worker_started_on_a_backlog_takes_it_without_waiting_for_a_sweep(
    store_url: str,
) -> None:
    """Work queued before the worker was listening reaches it by no wake-up: it takes queued
    work as it starts, whatever its first sweep's random delay."""
    order = '{"order_id": "w3"}'
    out = await asyncio.to_thread(cli, store_url, "start", "cli.mail", "--input", order)
    settings = flowx.HostSettings.load().replace(
        recovery=True,
        timers=True,
        wakeups=False,
        recovery_scan_interval=NEVER,
        timer_poll_interval=NEVER,
    )
    host = flowx.FlowHost(store=flowx.from_url(store_url), flows=FLOWS, settings=settings)
    await host.open()
    try:
        await until_state(host, out.strip(), InstanceState.COMPLETED, timeout=30)
    finally:
        await host.drain(timeout=5)
