"""The NATS ingress's connection (R6.1, R9.8): it reconnects after a cut, a server down at
start-up is retried until it answers, a server that refuses us is one clear error; TLS with a
client certificate against a ``nats-server`` of its own (the outbox's TLS fixtures); the URL,
checked before any connection."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from flowx.ingress import IngressDispatcher
from flowx.ingress.nats_jetstream import NatsIngressUnavailable, NatsJetStreamIngress, parse_url
from flowx.ingress.urls import consumer_from_url, consumers_from_urls
from flowx.outbox.nats_jetstream import tls_context
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceState
from flowx.urls import BadURL
from tests.ingress.flows import FLOWS
from tests.ingress.jetstream import NATS, Recording, Stream, completed, consuming, order, own_stream
from tests.outbox.test_tls_brokers import nats_tls, pki  # noqa: F401 - fixtures
from tests.support.fault_proxy import FaultProxy
from tests.support.polling import until, until_sync
from tests.support.servers import free_port, port_open
from tests.support.tls import PKI

MakeHost = Callable[..., Any]


@pytest.fixture
async def stream() -> AsyncIterator[Stream]:
    async with own_stream() as made:
        yield made


async def test_the_ingress_reconnects_after_its_connection_is_cut(
    stream: Stream, host_factory: MakeHost
) -> None:
    host = await host_factory(*FLOWS)
    server = urlsplit(NATS)
    async with FaultProxy(server.hostname or "127.0.0.1", server.port or 4222) as proxy:
        url = f"nats://127.0.0.1:{proxy.port}/{stream.name}/workers"
        async with consuming(url, Recording(host)) as ingress:
            await stream.publish(order("before"))
            await until(lambda: completed(host, 1), within=10, what="the first one completed")
            await proxy.refuse()  # a broker restart, as the worker sees it
            await until(lambda: not ingress.connected, within=10, what="the connection cut")
            await stream.publish(order("during"))
            await proxy.forward()
            await until(lambda: ingress.connected, within=10, what="the ingress reconnected")
            await until(lambda: completed(host, 2), within=20, what="the second one completed")
            await until(stream.drained, within=10, what="both acked")


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("nats://u:hunter2@h:4222", "use nats://host:4222/<stream>/<consumer>"),
        ("nats://u:hunter2@h:4222/only-stream", "use nats://host:4222/<stream>/<consumer>"),
        ("amqp://u:hunter2@h/s/c", "use nats://host:4222/<stream>/<consumer>"),
        ("nats://u:hunter2@h:4222/a.b/c", "stream name 'a.b' may hold only"),
        ("nats://u:hunter2@h:4222/s/c*", "consumer name 'c*' may hold only"),
        ("nats://u:hunter2@h:4222/s/c?queue=orders", "unknown parameter 'queue'"),
        ("nats://u:hunter2@h:4222/s/c?batch=0", "batch='0' must be a number of at least 1"),
        ("nats://u:hunter2@h:4222/s/c?ack_wait=x", "ack_wait='x' must be a number"),
        ("nats://u:hunter2@h:4222/s/c?filter=a.>.b", "filter 'a.>.b' must be a subject"),
        ("nats://u:hunter2@h:4222/s/c?dead_subject=a.>", "dead_subject 'a.>' must be"),
        ("nats://u:hunter2@h:99999/s/c", "port"),
    ],
)
def test_a_bad_url_is_refused_in_one_line_without_its_password(url: str, said: str) -> None:
    with pytest.raises(BadURL) as caught:
        parse_url(url)
    message = str(caught.value)
    assert said in message and "\n" not in message and "hunter2" not in message


def test_unusable_tls_files_are_refused_when_the_ingress_is_built() -> None:
    with pytest.raises(BadURL, match="the TLS files cannot be used") as caught:
        NatsJetStreamIngress("tls://h:4222/S/c?tls_ca=/nonexistent/ca.pem")
    assert caught.value.code == "ingress.bad_url"


def test_a_good_url_names_server_stream_consumer_and_dead_subject() -> None:
    target = parse_url("nats://u:pw@nats.local:4222/ORDERS/workers?dead_subject=dlq.orders")
    assert (target.server, target.stream, target.consumer, target.dead_prefix) == (
        "nats://u:pw@nats.local:4222",
        "ORDERS",
        "workers",
        "dlq.orders",
    )
    assert parse_url("tls://h:4222/S/c").wants_tls
    assert parse_url("nats://h/S/c").dead_prefix == "flowx.dead.S"


async def test_a_missing_stream_is_said_at_start(stream: Stream, host_factory: MakeHost) -> None:
    dispatcher = IngressDispatcher(await host_factory(*FLOWS))
    with pytest.raises(NatsIngressUnavailable, match="stream 'FXT_none' does not exist"):
        await NatsJetStreamIngress(f"{NATS}/FXT_none/workers").start(dispatcher)


async def test_a_server_down_at_start_is_retried_until_it_answers(
    stream: Stream, host_factory: MakeHost
) -> None:
    host = await host_factory(*FLOWS)
    server = urlsplit(NATS)
    async with FaultProxy(server.hostname or "127.0.0.1", server.port or 4222) as proxy:
        await proxy.refuse()
        url = f"nats://u:hunter2@127.0.0.1:{proxy.port}/{stream.name}/workers"
        async with consuming(url, Recording(host)) as ingress:  # returns: retrying
            assert not ingress.connected
            await stream.publish(order("late"))
            await proxy.forward()
            await until(lambda: completed(host, 1), within=20, what="the late one completed")


@pytest.fixture
def nats_with_login() -> Iterator[int]:
    """A ``nats-server`` of its own that wants user ``u``, password ``right``."""
    binary = shutil.which("nats-server")
    if binary is None:
        pytest.skip("nats-server is not installed")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", str(port), "--user", "u", "--pass", "right"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        until_sync(lambda: port_open(port), within=10, what="nats-server listening")
        yield port
    finally:
        proc.kill()
        proc.wait()


async def test_a_refused_login_is_one_error_without_the_password(
    nats_with_login: int, host_factory: MakeHost
) -> None:
    dispatcher = IngressDispatcher(await host_factory(*FLOWS))
    url = f"nats://u:Wr0ng-pw@127.0.0.1:{nats_with_login}/S/c"
    with pytest.raises(NatsIngressUnavailable, match="refused the connection") as caught:
        await NatsJetStreamIngress(url, timeout=5).start(dispatcher)
    assert caught.value.code == "ingress.refused"
    assert "Wr0ng" not in str(caught.value) and "\n" not in str(caught.value)


async def test_a_dead_subject_the_stream_itself_captures_is_refused(
    stream: Stream, host_factory: MakeHost
) -> None:
    dispatcher = IngressDispatcher(await host_factory(*FLOWS))
    url = stream.url(query=f"dead_subject={stream.prefix}.dead")
    with pytest.raises(NatsIngressUnavailable, match="dead letters would come back as work"):
        await NatsJetStreamIngress(url).start(dispatcher)


def test_a_nats_ingress_url_is_dispatched_to_this_adapter() -> None:
    (consumer,) = consumers_from_urls(["nats://u:hunter2@h:4222/ORDERS/workers"])
    assert isinstance(consumer, NatsJetStreamIngress)
    assert consumer.name == "nats stream 'ORDERS' consumer 'workers'"
    assert isinstance(consumer_from_url("tls://h:4222/ORDERS/workers"), NatsJetStreamIngress)


def _files(certs: PKI) -> dict[str, str]:
    return {
        "tls_ca": str(certs.ca),
        "tls_cert": str(certs.client.cert),
        "tls_key": str(certs.client.key),
    }


async def test_the_ingress_consumes_over_verified_tls(
    nats_tls: int,  # noqa: F811 - the fixture imported above
    pki: PKI,  # noqa: F811
    host_factory: MakeHost,
) -> None:
    import nats

    server = f"tls://127.0.0.1:{nats_tls}"
    nc = await nats.connect(server, tls=tls_context(server, _files(pki)))
    try:
        js = nc.jetstream()
        await js.add_stream(name="INGRESS_TLS", subjects=["ingress_tls.>"])
        await js.publish("ingress_tls.ing.order", b'{"order_id": "tls-1"}')
        host = await host_factory(*FLOWS)
        query = "&".join(f"{k}={quote(v)}" for k, v in _files(pki).items())
        ingress = NatsJetStreamIngress(f"{server}/INGRESS_TLS/workers?{query}")
        await ingress.start(IngressDispatcher(host))
        try:

            async def completed() -> bool:
                assert host.store is not None
                found = await host.store.catalog.list_instances(InstanceQuery())
                return [r.state for r in found] == [InstanceState.COMPLETED]

            await until(completed, within=10, what="the message over TLS completed")
        finally:
            await ingress.stop(timeout=5)
    finally:
        await nc.jetstream().delete_stream("INGRESS_TLS")
        await nc.close()


async def test_a_server_in_clear_asked_for_tls_is_refused(
    pki: PKI,  # noqa: F811
    host_factory: MakeHost,
) -> None:
    url = f"nats://127.0.0.1:4222/S/c?tls_ca={quote(str(pki.ca))}"
    dispatcher = IngressDispatcher(await host_factory(*FLOWS))
    with pytest.raises(NatsIngressUnavailable, match="does not require TLS"):
        await NatsJetStreamIngress(url, timeout=2).start(dispatcher)


async def test_a_deleted_consumer_is_reported_and_not_created_again(
    stream: Stream,
    host_factory: MakeHost,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from nats.js.errors import NotFoundError

    from flowx.ingress import nats_jetstream

    monkeypatch.setattr(nats_jetstream, "IDLE_CHECK", 0.05)
    host = await host_factory(*FLOWS)
    async with consuming(stream.url(), Recording(host), fetch_wait=0.2):
        await stream.nc.jetstream().delete_consumer(stream.name, "workers")
        await until(
            lambda: any("is gone" in r.getMessage() for r in caplog.records),
            within=10,
            what="the missing consumer reported",
        )
    with pytest.raises(NotFoundError):  # a new one would read the stream from its start
        await stream.consumer()
