"""``flowx worker --ingress …?partitions=4`` as two real processes on PostgreSQL and the real
RabbitMQ (issue 18 item 1; R6.1): the workers share the partitions, one is SIGKILLed
mid-stream, the other takes its partitions over, and for every tenant the instances were
started (``created_at``, the journal's own clock) in publish order, each message once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg

from tests.ingress.rabbit import Partitioned, per_tenant
from tests.ingress.test_worker_processes import ROOT, stop
from tests.postgres_support import PG_DSN
from tests.support.polling import until, until_sync

TENANTS = [f"tenant-{k}" for k in range(16)]
PER_TENANT = 3


def _worker(db: str, url: str, where: Path, name: str) -> subprocess.Popen[bytes]:
    """A ``flowx worker`` with two flow slots (fewer than the four partitions it may hold),
    logging to ``<where>/<name>.log`` (a file: a pipe nobody reads would fill and stall it)."""
    env = {
        **os.environ,
        "FLOWX_LEASE_TTL": "2s",
        "FLOWX_RECOVERY_SCAN_INTERVAL": "200ms",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable, "-m", "flowx.cli.main", "worker", "--db", db,
        "--flows", "tests.ingress.flows:FLOWS", "--ingress", url,
        "--ready-file", str(where / f"{name}.ready"), "--max-concurrent-flows", "2",
        "--log-level", "info",
    ]  # fmt: skip
    with (where / f"{name}.log").open("wb") as log:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)


def started(schema: str) -> list[tuple[str, str | None]]:
    """(idempotency key, node of its first step) of every instance, oldest first."""
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        rows = conn.execute(
            f'SELECT i.idempotency_key, (SELECT s.node_id FROM "{schema}".flow_step s '
            "WHERE s.instance_id = i.instance_id ORDER BY s.sequence LIMIT 1) "
            f'FROM "{schema}".flow_instance i ORDER BY i.created_at, i.instance_id'
        ).fetchall()
    return [(key, node) for key, node in rows]


async def test_a_worker_killed_mid_stream_hands_its_partitions_over_in_order(
    partitioned: Partitioned, pg_schema: Callable[[], str], tmp_path: Path
) -> None:
    schema = pg_schema()
    db = f"{PG_DSN}?flowx_schema={schema}"
    url = partitioned.url()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name in ("first", "second"):
            procs.append(_worker(db, url, tmp_path, name))
            until_sync(
                (tmp_path / f"{name}.ready").exists, within=30, what=f"the {name} worker is ready"
            )
        keys = [(t, f"{t}.m-{i:02d}") for i in range(PER_TENANT) for t in TENANTS]
        for tenant, key in keys:
            await partitioned.publish(tenant, key, routing_key="shop.ing.slow")
        await until(
            lambda: len({node for _, node in started(schema) if node}) == 2,
            within=60,
            what="both workers start some instances",
        )
        procs[0].send_signal(signal.SIGKILL)
        assert procs[0].wait(timeout=10) == -signal.SIGKILL
        assert len(started(schema)) < len(keys)  # killed mid-stream: messages were left
        await until(
            lambda: len(started(schema)) == len(keys),
            within=90,
            what="the survivor starts every message",
        )
    finally:
        for proc in procs:
            stop(proc)
    order = [key or "" for key, _ in started(schema)]
    assert sorted(order) == sorted(key for _, key in keys)  # each message once
    assert per_tenant(order) == per_tenant([key for _, key in keys])
