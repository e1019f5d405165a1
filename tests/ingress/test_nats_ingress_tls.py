"""The NATS ingress over verified TLS with a client certificate (R9.8), against a
``nats-server`` of its own that requires both (the outbox's TLS fixtures); and a server in
clear, asked for TLS, is refused rather than spoken to."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest

from flowx.ingress import IngressDispatcher
from flowx.ingress.nats_jetstream import NatsIngressUnavailable, NatsJetStreamIngress
from flowx.outbox.nats_jetstream import tls_context
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceState
from tests.ingress.flows import FLOWS
from tests.outbox.test_tls_brokers import nats_tls, pki  # noqa: F401 - fixtures
from tests.support.polling import until
from tests.support.tls import PKI

MakeHost = Callable[..., Any]


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
