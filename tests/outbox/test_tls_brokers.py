"""TLS to Redis, NATS and RabbitMQ (issue 17 item 4, "Transport security"; R9.8).

End to end, against throwaway servers of this module's own started with certificates
generated per run (tests/support/tls.py): the Redis lease store and the Redis Streams
publisher over ``rediss://`` with ``ssl_ca_certs``/``ssl_certfile``/``ssl_keyfile`` (the
server requires a client certificate), and the NATS JetStream publisher over ``tls://`` with
FlowX's ``tls_ca``/``tls_cert``/``tls_key``; each also refused when the URL names another CA.

RabbitMQ over ``amqps://`` is only checked to reach aiormq as written (its ``cafile``,
``certfile``, ``keyfile`` query parameters): no TLS broker is started here.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import pytest

from flowx.hosting.stores import redis_leases
from flowx.outbox import NatsJetStreamPublisher, RabbitMQPublisher, RedisStreamsPublisher
from flowx.outbox.urls import publisher_from_url
from flowx.stores.records import EventRecord
from flowx.urls import BadURL
from tests.support.servers import free_port, port_open
from tests.support.tls import PKI, make_pki


def _q(path: Path) -> str:
    return quote(str(path), safe="/")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("tls") / "broker certs")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def redis_tls(pki: PKI) -> Iterator[int]:
    """A ``redis-server`` that speaks only TLS and requires a client certificate."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(pki.server.cert), "--tls-key-file", str(pki.server.key),
         "--tls-ca-cert-file", str(pki.ca), "--tls-auth-clients", "yes",
         "--save", "", "--appendonly", "no", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not port_open(port):
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                pytest.skip(f"this redis-server cannot serve TLS: {err.strip()[-200:]}")
            assert time.monotonic() < deadline, "redis-server did not listen within 10 s"
            time.sleep(0.02)
        yield port
    finally:
        _stop(proc)


def _rediss(port: int, pki: PKI, ca: Path | None = None) -> str:
    return (
        f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={_q(ca or pki.ca)}"
        f"&ssl_certfile={_q(pki.client.cert)}&ssl_keyfile={_q(pki.client.key)}"
    )


async def test_the_redis_lease_store_works_over_verified_tls(redis_tls: int, pki: PKI) -> None:
    store = redis_leases(_rediss(redis_tls, pki) + "&flowx_prefix=tls")
    await store.open()
    try:
        lease = await store.acquire(
            "00000000-0000-0000-0000-000000000001", owner="n1", ttl=timedelta(seconds=5), now=None
        )
        assert lease is not None and lease.token >= 1
        connection = await store._client.connection_pool.get_connection()
        try:
            # The socket is TLS, and the server accepted our client certificate.
            assert connection._writer.get_extra_info("ssl_object") is not None
        finally:
            await store._client.connection_pool.release(connection)
    finally:
        await store.close()


async def test_a_redis_server_certificate_from_another_ca_is_refused(
    redis_tls: int, pki: PKI
) -> None:
    store = redis_leases(_rediss(redis_tls, pki, ca=pki.wrong_ca), socket_timeout=2.0)
    try:
        with pytest.raises(BadURL, match=r"certificate verify failed.*check ssl_ca_certs"):
            await store.open()
    finally:
        await store.close()


async def test_a_redis_tls_file_that_is_not_there_is_bad_url(redis_tls: int, pki: PKI) -> None:
    store = redis_leases(_rediss(redis_tls, pki, ca=Path("/nonexistent/ca.crt")))
    try:
        with pytest.raises(BadURL, match=r"No such file.*check ssl_ca_certs"):
            await store.open()
    finally:
        await store.close()


async def test_the_redis_streams_publisher_publishes_over_verified_tls(
    redis_tls: int, pki: PKI
) -> None:
    publisher = publisher_from_url(_rediss(redis_tls, pki))
    assert isinstance(publisher, RedisStreamsPublisher)
    try:
        await publisher.open()
        assert await publisher._client.ping() is True
    finally:
        await publisher.close()


@pytest.fixture(scope="module")
def nats_tls(pki: PKI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A ``nats-server`` with JetStream that requires TLS and a client certificate."""
    binary = shutil.which("nats-server")
    if binary is None:
        pytest.skip("nats-server is not installed")
    port = free_port()
    store = tmp_path_factory.mktemp("nats-js")
    proc = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store),
         "--tlsverify", "--tlscert", str(pki.server.cert), "--tlskey", str(pki.server.key),
         "--tlscacert", str(pki.ca)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not port_open(port):
            assert proc.poll() is None, "nats-server exited"
            assert time.monotonic() < deadline, "nats-server did not listen within 10 s"
            time.sleep(0.02)
        yield port
    finally:
        _stop(proc)


def _tls_nats(port: int, pki: PKI, ca: Path | None = None) -> str:
    return (
        f"tls://127.0.0.1:{port}?tls_ca={_q(ca or pki.ca)}"
        f"&tls_cert={_q(pki.client.cert)}&tls_key={_q(pki.client.key)}"
    )


async def test_the_nats_publisher_publishes_over_verified_tls(nats_tls: int, pki: PKI) -> None:
    publisher = publisher_from_url(_tls_nats(nats_tls, pki))
    assert isinstance(publisher, NatsJetStreamPublisher)
    assert "tls_" not in publisher.url  # FlowX's own parameters never reach nats-py
    try:
        await publisher.open()
        await publisher._nc.jetstream().add_stream(name="TLS", subjects=["flowx.events.>"])
        event = EventRecord(
            event_id="00000000-0000-0000-0000-0000000000e1",
            instance_id="00000000-0000-0000-0000-000000000001",
            sequence=1, ordinal=0, staged_seq=1, type="tls.checked", schema_version="1",
            partition_key="k", payload='{"ok": true}', published_at=None,
        )  # fmt: skip
        result = await publisher.publish([event])
        assert (result.acknowledged, result.failure) == (1, None)
        # The JetStream stream holds it: the ack came over the verified connection.
        info = await publisher._nc.jetstream().stream_info("TLS")
        assert info.state.messages == 1
    finally:
        await publisher.close()


async def test_a_nats_server_certificate_from_another_ca_is_refused(
    nats_tls: int, pki: PKI
) -> None:
    publisher = NatsJetStreamPublisher(_tls_nats(nats_tls, pki, ca=pki.wrong_ca), timeout=2.0)
    try:
        with pytest.raises(Exception, match="certificate verify failed"):
            await publisher.open()
    finally:
        await publisher.close()


async def test_a_nats_server_that_does_not_require_tls_is_refused(pki: PKI) -> None:
    """The shared NATS speaks in clear: asked for TLS, the publisher does not use it."""
    publisher = NatsJetStreamPublisher(f"nats://127.0.0.1:4222?tls_ca={_q(pki.ca)}", timeout=2)
    try:
        with pytest.raises(ConnectionError, match="does not require TLS"):
            await asyncio.wait_for(publisher.open(), 5)
    finally:
        await publisher.close()


def test_nats_tls_files_that_cannot_be_used_are_bad_url(pki: PKI) -> None:
    with pytest.raises(BadURL, match="tls_ca, tls_cert and tls_key"):
        publisher_from_url("tls://127.0.0.1:4222?tls_ca=/nonexistent/ca.crt")
    with pytest.raises(BadURL, match="go together"):
        publisher_from_url(f"tls://127.0.0.1:4222?tls_cert={_q(pki.client.cert)}")


async def test_amqps_parameters_reach_aiormq_as_written(pki: PKI) -> None:
    """Passed through only: aiormq reads ``cafile``/``certfile``/``keyfile`` from the URL."""
    import aiormq

    url = (
        f"amqps://guest:guest@127.0.0.1:5671/?cafile={_q(pki.ca)}"
        f"&certfile={_q(pki.client.cert)}&keyfile={_q(pki.client.key)}"
    )
    publisher = publisher_from_url(url)
    assert isinstance(publisher, RabbitMQPublisher) and publisher.url == url
    certs = aiormq.Connection(publisher.url).ssl_certs
    assert (certs.cafile, certs.cert, certs.key, certs.verify) == (
        str(pki.ca),
        str(pki.client.cert),
        str(pki.client.key),
        True,
    )
