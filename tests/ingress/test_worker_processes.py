"""``flowx worker --ingress`` as real processes on PostgreSQL and the real RabbitMQ (R6.1):
a worker SIGKILLed mid-batch loses no message — what it had started is resumed by recovery,
what it held unacked is redelivered to the next worker, and the idempotency key keeps every
message to one instance."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import psycopg
import pytest

from tests.ingress.rabbit import TestQueue, own_queue
from tests.postgres_support import PG_DSN
from tests.support.polling import until, until_sync

ROOT = Path(__file__).resolve().parents[2]
N = 20


@pytest.fixture
async def queue() -> AsyncIterator[TestQueue]:
    async with own_queue() as made:
        await made.declare()
        yield made


def worker(db: str, ingress: str, ready: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "FLOWX_LEASE_TTL": "2s",
        "FLOWX_RECOVERY_SCAN_INTERVAL": "200ms",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowx.cli.main",
            "worker",
            "--db",
            db,
            "--flows",
            "tests.ingress.flows:FLOWS",
            "--ingress",
            ingress,
            "--ready-file",
            str(ready),
            "--log-level",
            "warning",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def states(schema: str) -> dict[str, int]:
    """Instances of ``ing.slow`` by state, read straight from the journal's table."""
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        rows = conn.execute(
            f'SELECT state, count(*) FROM "{schema}".flow_instance '
            "WHERE flow_id = 'ing.slow' GROUP BY state"
        ).fetchall()
    return {state: count for state, count in rows}


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


async def test_a_worker_killed_mid_batch_loses_no_message_and_starts_none_twice(
    queue: TestQueue, pg_schema: Callable[[], str], tmp_path: Path
) -> None:
    schema = pg_schema()
    db = f"{PG_DSN}?flowx_schema={schema}"
    first = worker(db, queue.url(), tmp_path / "first.ready", "--max-concurrent-flows", "2")
    second: subprocess.Popen[bytes] | None = None
    try:
        until_sync((tmp_path / "first.ready").exists, within=30, what="the first worker is ready")
        for i in range(N):
            await queue.publish(
                {"order_id": f"o-{i}"}, message_id=f"m-{i}", routing_key="shop.ing.slow"
            )
        await until(
            lambda: sum(states(schema).values()) >= 3,
            within=30,
            what="the first worker starts some instances",
        )
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL
        assert sum(states(schema).values()) < N  # killed mid-batch: messages were left
        second = worker(db, queue.url(), tmp_path / "second.ready")
        await until(
            lambda: states(schema) == {"Completed": N},
            within=60,
            what=f"all {N} messages completed once",
        )
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0  # it stopped consuming, drained, exited cleanly
        # Nothing requeued when its connection closed: every message had been acked.
        assert await queue.depth() == 0
    finally:
        for proc in (first, second):
            if proc is not None:
                stop(proc)
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        keys = conn.execute(f'SELECT idempotency_key FROM "{schema}".flow_instance').fetchall()
    assert sorted(k for (k,) in keys) == sorted(f"m-{i}" for i in range(N))
