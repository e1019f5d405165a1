"""Least-privilege database roles against the real PostgreSQL (R9.8).

One schema of its own; ``flowx migrate --roles`` (as the superuser) makes its group roles
and one LOGIN user per role (trust auth: no passwords). Every job then runs AS ITS ROLE:
the worker runs flows, the publisher relays the outbox, the retention role sweeps, the
reader lists. Roles are cluster-wide: names are unique per run and dropped at the end, even
when a test fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql

import flowx
from flowx.errors import JournalNotFound
from flowx.hosting.settings import HostSettings
from flowx.hosting.stores import postgres
from flowx.outbox import OutboxPublisher, RecordingPublisher
from flowx.stores.errors import StorePermissionDenied
from flowx.stores.postgres.roles import KINDS
from tests.cli.runner import invoke
from tests.cli.test_cli import ROOT
from tests.outbox.flows import Order, order_flow
from tests.postgres.support import PG_DSN, drop_schema

FLOWS = "tests.cli.wait_flows:FLOWS"


@dataclass(frozen=True)
class Fleet:
    schema: str
    logins: dict[str, str]  # kind -> LOGIN user

    def url(self, kind: str | None = None) -> str:
        """The store URL, logged in as ``kind``'s user (the superuser for ``None``)."""
        base = PG_DSN if kind is None else PG_DSN.replace("postgres@", f"{self.logins[kind]}@")
        return f"{base}?flowx_schema={self.schema}"


def _drop_roles(names: list[str]) -> None:
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        for name in names:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    schema = f"flowx_r_{uuid.uuid4().hex[:10]}"
    logins = {kind: f"{schema}_u_{kind}" for kind in KINDS}
    groups = [f"{schema}_{kind}" for kind in KINDS]
    try:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            for login in logins.values():
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(login)))
        fleet = Fleet(schema, logins)
        grants = [a for kind, login in logins.items() for a in ("--grant", f"{kind}={login}")]
        code, out, err = invoke("migrate", "--db", fleet.url(), "--roles", *grants)
        assert code == 0, err
        assert f"group roles (NOLOGIN): {schema}_owner" in out
        yield fleet
    finally:
        drop_schema(schema)
        _drop_roles(list(logins.values()) + groups)


def _privileges(schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        return conn.execute(
            "SELECT c.relname, a.grantee::regrole::text, a.privilege_type FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode(c.relacl) a "
            "WHERE n.nspname = %s ORDER BY 1, 2, 3",
            (schema,),
        ).fetchall()


def test_migrate_roles_twice_leaves_the_same_roles_grants_and_owner(fleet: Fleet) -> None:
    """R9.8: ``flowx migrate --roles`` is idempotent; the owner role owns every table."""
    before = _privileges(fleet.schema)
    code, _, err = invoke("migrate", "--db", fleet.url(), "--roles", "-o", "json")
    assert code == 0, err
    assert _privileges(fleet.schema) == before
    worker = {(t, p) for t, g, p in before if g == f"{fleet.schema}_worker"}
    assert ("flow_step", "INSERT") in worker
    assert not {p for _, p in worker} & {"DELETE", "TRUNCATE"}
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        owners = conn.execute(
            "SELECT DISTINCT c.relowner::regrole::text FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = %s",
            (fleet.schema,),
        ).fetchall()
        settings = conn.execute(
            "SELECT unnest(setconfig) FROM pg_db_role_setting s JOIN pg_roles r "
            "ON r.oid = s.setrole WHERE r.rolname = %s",
            (fleet.logins["worker"],),
        ).fetchall()
    assert owners == [(f"{fleet.schema}_owner",)]
    assert ("statement_timeout=20s",) in settings


async def test_a_worker_publisher_and_retention_sweep_each_run_as_their_role(
    fleet: Fleet,
) -> None:
    """R9.8: a host opens and runs flows as the worker role (so opening ran no DDL: the role
    may not), the relay publishes as the publisher role, the sweep deletes as retention."""
    settings = HostSettings.load(retention=False)
    host = flowx.FlowHost(
        store=postgres(fleet.url("worker")), flows=[order_flow], settings=settings
    )
    async with host:
        handles = [await host.start(order_flow, Order(order_id=f"r{i}")) for i in range(3)]
        results = await asyncio.gather(*(h.result() for h in handles))
    assert len(results) == 3

    stores = postgres(fleet.url("publisher"), migrate=False)
    await stores.open()
    try:
        broker = RecordingPublisher()
        assert await OutboxPublisher(stores.outbox, broker).drain() == 9
        assert all(json.loads(e.payload)["card"] == "[redacted]" for e in broker.received)
    finally:
        await stores.close()


def test_the_retention_role_sets_a_policy_and_sweeps(fleet: Fleet) -> None:
    """R9.8: the retention sweep, as its role, deletes ended instances (cascading to their
    steps and events) and purges published events."""
    code, _, err = invoke(
        "retention", "set", "--class", "Completed", "--keep", "1m", "--db", fleet.url("retention")
    )
    assert code == 0, err
    s = sql.Identifier(fleet.schema)
    iid = str(uuid.uuid4())
    with psycopg.connect(PG_DSN, autocommit=True) as conn:  # one ended an hour ago, a step
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.flow_instance (instance_id, flow_id, flow_version, state, input, "
                "state_bag, created_at, updated_at) VALUES (%s, 'shop.order', '1.0.0', "
                "'Completed', '{{}}', '{{}}', now() - interval '2 hours', "
                "now() - interval '1 hour')"
            ).format(s),
            (iid,),
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.flow_step (instance_id, scope, step_id, attempt, sequence, "
                "step_name, outcome, result, duration_ms, committed_at) VALUES "
                "(%s, '', 0, 1, 1, 'accept', 'Success', '1', 1, now() - interval '1 hour')"
            ).format(s),
            (iid,),
        )
        # ...and whatever the worker finished earlier in this module, aged the same way.
        ended = conn.execute(
            sql.SQL(
                "UPDATE {}.flow_instance SET updated_at = now() - interval '1 hour' "
                "WHERE state = 'Completed'"
            ).format(s)
        ).rowcount
    code, out, err = invoke("retention", "sweep", "--db", fleet.url("retention"), "-o", "json")
    assert code == 0, err
    assert json.loads(out)["deleted"] == ended >= 1
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        steps = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.flow_step WHERE instance_id = %s").format(s), (iid,)
        ).fetchone()
    assert steps == (0,)  # the cascade ran, though the role may not delete steps itself


def test_the_reader_lists_shows_and_counts_and_is_refused_a_write(fleet: Fleet) -> None:
    """R9.8: read commands work as the read-only role; a write is a clear error naming the
    login and the grant, exit 1, no traceback."""
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.flow_instance (instance_id, flow_id, flow_version, state, "
                "input, state_bag, created_at, updated_at) VALUES (%s, 'shop.order', '1.0.0', "
                "'Pending', '{{}}', '{{}}', now(), now())"
            ).format(sql.Identifier(fleet.schema)),
            (iid := str(uuid.uuid4()),),
        )
    reader = fleet.url("reader")
    code, out, err = invoke("list", "--db", reader, "-o", "json")
    assert code == 0, err
    assert iid in out
    assert invoke("show", iid, "--db", reader)[0] == 0
    code, out, err = invoke("count", "--db", reader, "-o", "json")
    assert code == 0, err
    code, out, err = invoke("doctor", "--db", reader, "-o", "json")
    assert "permission" not in err and json.loads(out)["store"]["schema_version"], err
    code, out, err = invoke(
        "retention", "set", "--class", "Failed", "--keep", "1d", "--db", reader, "-o", "json"
    )
    assert code == 1
    assert "Traceback" not in err
    login = fleet.logins["reader"]
    assert json.loads(out)["error"]["code"] == "store.permission_denied"
    assert f"role {login!r}" in err and "retention_policy" in err
    assert f"GRANT {fleet.schema}_retention TO {login}" in err


def test_the_worker_role_may_not_run_ddl_or_truncate(fleet: Fleet) -> None:
    """R9.8: the worker role writes rows, never the schema."""
    with psycopg.connect(fleet.url("worker").split("?")[0], autocommit=True) as conn:
        for statement in (
            "CREATE TABLE {}.sneaky (x int)",
            "TRUNCATE {}.flow_instance",
            "ALTER TABLE {}.flow_step ADD COLUMN x int",
            "DELETE FROM {}.flow_instance",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL(statement).format(sql.Identifier(fleet.schema)))


async def test_a_missing_schema_is_a_clear_error_for_a_role_that_may_not_create_it(
    fleet: Fleet,
) -> None:
    """R9.8: a node that would migrate but may not says so, naming `flowx migrate`; with
    migration off, the journal is simply not found."""
    missing = fleet.url("worker").replace(f"={fleet.schema}", f"={fleet.schema}_none")
    stores = postgres(missing)
    with pytest.raises(StorePermissionDenied) as refused:
        await stores.open()
    await stores.close()
    assert "flowx migrate" in str(refused.value)
    assert refused.value.login == fleet.logins["worker"]
    looking = postgres(missing, migrate=False)
    with pytest.raises(JournalNotFound, match="flowx migrate"):
        await looking.open()
    await looking.close()


def test_a_read_command_on_a_missing_schema_is_not_found_as_before(fleet: Fleet) -> None:
    """A read command, as the reader, on a schema that is not there: exit 3, nothing made."""
    missing = fleet.url("reader").replace(f"={fleet.schema}", f"={fleet.schema}_none")
    code, _, err = invoke("list", "--db", missing)
    assert code == 3, err
    assert "flowx migrate" in err


async def test_a_migration_runs_as_the_owner_role_and_renews_the_grants(fleet: Fleet) -> None:
    """R9.8: with the schema one migration behind, the worker role may not migrate it (a
    clear error naming `flowx migrate`); the owner's login migrates it as the owner role, and
    the grants — one revoked here — are renewed in the same transaction."""
    s = sql.Identifier(fleet.schema)
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP INDEX {}.flow_instance_correlation_idx").format(s))
        conn.execute(sql.SQL("DELETE FROM {}.flowx_schema_migrations WHERE version = 15").format(s))
        conn.execute(
            sql.SQL("REVOKE INSERT ON {}.flow_step FROM {}").format(
                s, sql.Identifier(f"{fleet.schema}_worker")
            )
        )
    worker = postgres(fleet.url("worker"))
    with pytest.raises(StorePermissionDenied, match="flowx migrate") as refused:
        await worker.open()
    await worker.close()
    assert "must be owner" in refused.value.refused
    owner = postgres(fleet.url("owner"))
    await owner.open()
    await owner.close()
    grants = _privileges(fleet.schema)
    assert ("flow_step", f"{fleet.schema}_worker", "INSERT") in grants
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        owners = conn.execute(
            "SELECT DISTINCT c.relowner::regrole::text FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = %s",
            (fleet.schema,),
        ).fetchall()
    assert owners == [(f"{fleet.schema}_owner",)]
    worker = postgres(fleet.url("worker"))
    await worker.open()  # current again: opens with no DDL
    await worker.close()


def test_flowx_worker_runs_a_started_flow_as_the_worker_role(fleet: Fleet) -> None:
    """R9.8: `flowx start` and `flowx worker` (sweeps off: that is the retention role's) as
    the worker role; `flowx result` as the reader sees it complete."""
    code, out, err = invoke(
        "start", "cli.saga", "--db", fleet.url("worker"), "--flows", FLOWS,
        "--input", '{"order_id": "w1"}', "-o", "json",
    )  # fmt: skip
    assert code == 0, err
    iid = json.loads(out)["instance_id"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    env.pop("FLOWX_CLI_FAULTS", None)
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "flowx.cli.main", "worker", "--db", fleet.url("worker"),
            "--flows", FLOWS, "--no-retention", "--recovery-scan-interval", "1s",
            "--shutdown-drain-timeout", "5s",
        ],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        code, out, err = invoke(
            "result", iid, "--db", fleet.url("reader"), "--wait", "30", "-o", "json"
        )
        assert code == 0, err
        assert json.loads(out)["state"] == "Completed"
        proc.send_signal(signal.SIGTERM)
        _, log = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log
    assert "permission denied" not in log
