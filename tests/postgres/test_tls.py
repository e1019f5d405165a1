"""PostgreSQL over verified TLS, end to end (issue 17 item 4, "Transport security"; R9.8).

A throwaway cluster of this module's own (``initdb`` on a free port, never the shared server)
runs with ``ssl=on`` and a ``pg_hba.conf`` that admits only TLS connections from 127.0.0.1
presenting a client certificate signed by a CA generated here (``hostssl ... cert``; no
non-TLS ``host`` line). FlowX is given nothing but a URL:
``?sslmode=verify-full&sslrootcert=...&sslcert=...&sslkey=...``, with the files in a folder
whose name holds a space (percent-encoded in the URL), so a URL that FlowX re-encoded on the
way to libpq would name a file that does not exist.

Asserted: a durable flow runs to completion through ``FlowHost`` and its events go out through
the outbox relay, every connection FlowX held at the time (the pool, the committers, the lease
renewer, the LISTEN wake-ups) is TLS with the client certificate's name, as the server's own
``pg_stat_ssl`` reports; ``flowx migrate`` and ``flowx list`` work with the same URL; a server
certificate signed by another CA, a missing client certificate, a CA file that is not there,
``sslmode=disable`` and a host name the server's certificate does not carry are each refused
at once with one ``StoreMisconfigured`` line naming the cause (exit code 1 from the CLI, no
traceback).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

import flowx
from flowx.outbox.recording import RecordingPublisher
from flowx.stores.errors import StoreMisconfigured
from flowx.stores.postgres import PostgresStores
from tests.cli.runner import invoke as flowx_
from tests.outbox.flows import Order, order_flow
from tests.support.servers import ServerUnavailable, ThrowawayPostgres
from tests.support.tls import PKI, make_pki

#: The only role; PostgreSQL's ``cert`` authentication maps the client certificate's CN to it.
ROLE = "postgres"


@dataclass(frozen=True)
class TLSCluster:
    port: int
    pki: PKI

    def url(self, schema: str, **params: str | Path) -> str:
        """A URL with ``verify-full`` and this module's CA and client certificate, unless
        ``params`` says otherwise (an empty value leaves a parameter out)."""
        given: dict[str, str | Path] = {
            "sslmode": "verify-full",
            "sslrootcert": self.pki.ca,
            "sslcert": self.pki.client.cert,
            "sslkey": self.pki.client.key,
            **params,
            "flowx_schema": schema,
        }
        query = "&".join(f"{k}={quote(str(v), safe='/')}" for k, v in given.items() if v != "")
        return f"postgresql://{ROLE}@127.0.0.1:{self.port}/postgres?{query}"


@pytest.fixture(scope="module")
def cluster() -> Iterator[TLSCluster]:
    try:
        pg = ThrowawayPostgres("flowx-tls-pg-")
    except ServerUnavailable as exc:
        pytest.skip(f"no throwaway PostgreSQL cluster here: {exc}")
    try:
        pg.init()
        pki = make_pki(pg.dir / "tls certs", client_name=ROLE)
        shutil.chown(pki.server.cert, "postgres", "postgres")
        shutil.chown(pki.server.key, "postgres", "postgres")
        with (pg.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"ssl = on\nssl_cert_file = '{pki.server.cert}'\n"
                f"ssl_key_file = '{pki.server.key}'\nssl_ca_file = '{pki.ca}'\n"
            )
        # TLS with a client certificate from 127.0.0.1, and nothing else over TCP; the Unix
        # socket (pg_ctl's own) stays open to the postgres user alone.
        (pg.data / "pg_hba.conf").write_text(
            "local all postgres peer\nhostssl all all 127.0.0.1/32 cert\n"
        )
        pg.start()  # pg_ctl -w: returns once the server accepts connections
        yield TLSCluster(pg.port, pki)
    finally:
        pg.destroy()  # pg_ctl stop -m immediate, then the directory (certificates included)


async def _tls_sessions(cluster: TLSCluster) -> list[dict[str, Any]]:
    """Every client session the server has but the asking one, with its TLS state."""
    conninfo = cluster.url("flowx").replace("&flowx_schema=flowx", "")
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        own = await (
            await conn.execute(
                "SELECT ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
            )
        ).fetchone()
        assert own == (True, f"/CN={ROLE}")
        rows = await (
            await conn.execute(
                "SELECT a.application_name, a.query, s.ssl, s.version, s.client_dn "
                "FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
                "WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()"
            )
        ).fetchall()
    keys = ("application", "query", "ssl", "version", "client_dn")
    return [dict(zip(keys, row, strict=True)) for row in rows]


async def test_a_durable_flow_runs_over_verified_tls_with_a_client_certificate(
    cluster: TLSCluster,
) -> None:
    """The journal, the leases, the outbox relay and its LISTEN wake-ups all connect through
    the one URL's TLS settings; the server confirms each session is TLS with our client
    certificate."""
    stores = flowx.postgres(cluster.url("flowx_tls_host"))
    assert isinstance(stores, PostgresStores)
    broker = RecordingPublisher()
    async with flowx.FlowHost(store=stores, flows=[order_flow], publisher=broker) as host:
        handles = [await host.start(order_flow, Order(order_id=f"tls{i}")) for i in range(5)]
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 30)
        assert [r.note for r in results] == [f"accepted tls{i}" for i in range(5)]
        async with asyncio.timeout(30):  # the relay publishes what the flows staged
            while await stores.outbox.pending_count():
                await asyncio.sleep(0.02)
        async with stores.db.connection() as conn:
            row = await (
                await conn.execute(
                    "SELECT ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                )
            ).fetchone()
        assert row == (True, f"/CN={ROLE}")
        sessions = await _tls_sessions(cluster)
    assert len(broker.received) == 3 * len(handles)
    assert sessions, "FlowX held no session"
    assert all(s["ssl"] and s["client_dn"] == f"/CN={ROLE}" for s in sessions), sessions
    assert all(s["version"].startswith("TLSv1.") for s in sessions), sessions
    # The wake-up connections (outbox and work) are there, and TLS like the rest.
    listening = {s["query"] for s in sessions if s["query"].startswith("LISTEN")}
    assert listening == {
        'LISTEN "flowx_outbox_flowx_tls_host"',
        'LISTEN "flowx_work_flowx_tls_host"',
    }, sessions


def test_the_cli_migrates_and_lists_over_verified_tls(cluster: TLSCluster) -> None:
    url = cluster.url("flowx_tls_cli")
    code, out, err = flowx_("migrate", "--db", url, "-o", "json")
    assert (code, err) == (0, ""), err
    assert json.loads(out)["schema_version"] >= 1
    code, out, err = flowx_("list", "--db", url, "-o", "json")
    assert (code, err) == (0, ""), err
    assert json.loads(out) == {"instances": [], "next": None}


REFUSALS = {
    "another CA signed the server's certificate": (
        {"sslrootcert": "wrong"},
        "certificate verify failed",
    ),
    "no client certificate": (
        {"sslcert": "", "sslkey": ""},
        "requires a valid client certificate",
    ),
    "the CA file is not there": (
        {"sslrootcert": "/nonexistent/ca.crt"},
        'root certificate file "/nonexistent/ca.crt" does not exist',
    ),
    "no TLS at all": (
        {"sslmode": "disable", "sslrootcert": "", "sslcert": "", "sslkey": ""},
        "no encryption",
    ),
    # The right server, reached by an address, under a name its certificate does not carry
    # (``hostaddr`` connects, ``host`` is what verify-full checks the certificate against).
    "the server's certificate names another host": (
        {"host": "db.elsewhere.test", "hostaddr": "127.0.0.1"},
        'does not match host name "db.elsewhere.test"',
    ),
}


def _refused_url(cluster: TLSCluster, params: dict[str, str]) -> str:
    given: dict[str, str | Path] = dict(params)
    if given.get("sslrootcert") == "wrong":
        given["sslrootcert"] = cluster.pki.wrong_ca
    return cluster.url("flowx_tls_refused", **given)


@pytest.mark.parametrize(("params", "says"), REFUSALS.values(), ids=REFUSALS.keys())
async def test_a_connection_tls_does_not_verify_is_refused_at_once_by_name(
    cluster: TLSCluster, params: dict[str, str], says: str
) -> None:
    """Retrying cannot mend any of these: the store's open fails with
    ``StoreMisconfigured`` (not "unavailable, retry"), on one line, naming the cause."""
    stores = flowx.postgres(_refused_url(cluster, params))
    try:
        with pytest.raises(StoreMisconfigured) as caught:
            await stores.open()
    finally:
        await stores.close()
    message = str(caught.value)
    assert says in message and "\n" not in message
    assert not isinstance(caught.value, flowx.JournalUnavailable)


@pytest.mark.parametrize(("params", "says"), REFUSALS.values(), ids=REFUSALS.keys())
def test_the_cli_refuses_it_with_one_line_and_exit_code_1(
    cluster: TLSCluster, params: dict[str, str], says: str
) -> None:
    code, out, err = flowx_("list", "--db", _refused_url(cluster, params))
    assert code == 1  # EXIT_ERROR: a FlowX error, not "not found" nor a usage error
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1, err
    assert says in err and "Traceback" not in err
