"""What the multi-host test runs on: a throwaway PostgreSQL reachable from three network
namespaces, the ledger and the fence audit in it, and ``flowx worker`` processes inside the
namespaces (``tests/support/netns.py``).

The journal server is a cluster of the test's own (``tests/support/servers.py``) listening on
loopback — for the test's own eyes — and on the root side of every host's veth, with ``trust``
for the run's /24 alone. The shared server on 127.0.0.1:5432 is never reconfigured, and a
worker could not reach it anyway: its ``127.0.0.1`` is its namespace's own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tests.support.netns import NetworkHosts
from tests.support.polling import until_sync
from tests.support.servers import ThrowawayPostgres

ROOT = Path(__file__).resolve().parents[2]
JOURNAL = "hosts_journal"
LEDGER = "hosts_ledger"

# The ledger of effects, the gate ``s2`` waits on, and the fence audit: a trigger on every
# step row inserted, which notes who holds the instance's lease at that moment. A lease is
# acquired and the fence raised in one statement (R2.4), and a commit holds the instance row
# locked, so a row written by a node that is not the lease's owner was written under a token
# below the fence: a write past a fence. The audit is the database's, not the node's: it sees
# rows however they got there, late TCP retransmissions included.
LEDGER_SCHEMA = f"""
CREATE SCHEMA {LEDGER};
CREATE TABLE {LEDGER}.ledger (
    effect_id uuid PRIMARY KEY, instance_id uuid NOT NULL, step text NOT NULL,
    node text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE {LEDGER}.gate (wave int PRIMARY KEY, open boolean NOT NULL);
INSERT INTO {LEDGER}.gate VALUES (1, false), (2, false);
CREATE TABLE {LEDGER}.fence_audit (
    instance_id uuid NOT NULL, sequence bigint NOT NULL, node_id text,
    lease_owner text, lease_token bigint, fence bigint);
CREATE FUNCTION {LEDGER}.audit_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {LEDGER}.fence_audit
    SELECT NEW.instance_id, NEW.sequence, NEW.node_id, l.owner_node, l.fencing_token, i.fence
      FROM {JOURNAL}.flow_instance i
      LEFT JOIN {JOURNAL}.flow_lease l ON l.instance_id = i.instance_id
     WHERE i.instance_id = NEW.instance_id;
    RETURN NEW;
END $$;
CREATE TRIGGER audit_step BEFORE INSERT ON {JOURNAL}.flow_step
    FOR EACH ROW EXECUTE FUNCTION {LEDGER}.audit_step();
"""


def start_journal(net: NetworkHosts) -> ThrowawayPostgres:
    """A cluster listening on loopback and on every host's gateway, trusting the run's /24."""
    pg = ThrowawayPostgres(
        "flowx-hosts-pg-", {"listen_addresses": ",".join(["127.0.0.1", *net.gateways])}
    )
    try:
        pg.init()
        with (pg.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {net.subnet} trust\n")
        pg.start()
    except BaseException:
        pg.destroy()
        raise
    return pg


def sql(pg: ThrowawayPostgres, query: str, *args: Any) -> list[tuple[Any, ...]]:
    """The test's own eyes, over loopback, in the journal's and the ledger's schemas."""
    with psycopg.connect(pg.dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"SET search_path = {JOURNAL}, {LEDGER}")
        cur = conn.execute(query, args or None)
        return cur.fetchall() if cur.description else []


def prepare_ledger(pg: ThrowawayPostgres) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(LEDGER_SCHEMA)


@dataclass
class Worker:
    """A ``flowx worker`` inside host ``name``'s namespace (``ip netns exec`` execs it, so
    ``proc.pid`` is the worker's own pid)."""

    name: str
    node: str
    proc: subprocess.Popen[bytes]
    log: Path
    ready: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def is_ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"worker {self.node} exited ({self.proc.returncode}):\n{self.log_text()}"
            )
        return self.ready.exists()

    def kill(self) -> int:
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(timeout=30)

    def stop(self) -> int:
        """SIGTERM: drain, release every lease, exit (R7.2)."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def start_worker(
    net: NetworkHosts, name: str, pg: ThrowawayPostgres, run_dir: Path, settings: list[str]
) -> Worker:
    """``flowx worker`` in host ``name``: journal and ledger at the host's gateway, nothing at
    an address of the root namespace's own."""
    gateway = net[name].gateway
    server = f"postgres@{gateway}:{pg.port}/postgres"
    node = f"host-{name}"
    ledger = (
        f"postgresql://{server}?connect_timeout=2&tcp_user_timeout=1500"
        f"&options=-csearch_path%3D{LEDGER}"
    )
    env = {
        **os.environ,
        "HOSTS_LEDGER_DSN": ledger,
        "HOSTS_NODE": node,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    log, ready = run_dir / f"worker-{name}.log", run_dir / f"ready-{name}"
    argv = [
        sys.executable, "-m", "flowx.cli.main", "worker",
        "--db", f"postgresql://{server}?flowx_schema={JOURNAL}",
        "--flows", "tests.hosts.host_flows:FLOWS",
        "--node-id", node,
        "--ready-file", str(ready),
        "--log-level", "info",
        *settings,
    ]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(
            net.command(name, argv), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    return Worker(name, node, proc, log, ready)


def wait_ready(workers: list[Worker]) -> None:
    for w in workers:
        until_sync(w.is_ready, within=60, what=f"worker {w.node} ready")
