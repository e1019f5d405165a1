"""The broker-neutral ingress (R6.1, R9.9; SPEC §8 "poison message at ingress"): what one
delivery does to a node, whatever broker brought it. Hosts run on the in-memory store; the
real brokers are in ``test_rabbitmq.py``, the journal-down case on a real PostgreSQL behind a
fault proxy at the end of this module."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

import flowx
from flowx import metrics
from flowx.hosting.stores import postgres
from flowx.ingress import Dead, Delivery, IngressDispatcher, IngressRetry, Signalled, Started
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceState
from tests.ingress.flows import FLOWS, ORDER
from tests.postgres_support import PG_DSN
from tests.support.fault_proxy import FaultProxy
from tests.support.hosts import fold_settings
from tests.support.polling import until

MakeHost = Callable[..., Any]


def order(order_id: str = "o-1", **kw: Any) -> bytes:
    return json.dumps({"order_id": order_id, **kw}).encode()


def start(body: bytes, *, key: str | None = "m-1", **headers: str) -> Delivery:
    return Delivery(body=body, message_id=key, headers=headers, subject="shop.ing.order")


@pytest.fixture
async def dispatcher(host_factory: MakeHost) -> IngressDispatcher:
    return IngressDispatcher(await host_factory(*FLOWS), max_bytes=200)


async def instances(d: IngressDispatcher) -> list[Any]:
    store = d.host.store
    assert store is not None
    return list(await store.catalog.list_instances(InstanceQuery(limit=100)))


async def test_a_message_starts_the_flow_its_routing_key_names_and_it_completes(
    dispatcher: IngressDispatcher,
) -> None:
    verdict = await dispatcher.handle(start(order("o-1")))
    assert isinstance(verdict, Started) and verdict.created
    result = await dispatcher.host.handle(verdict.instance_id, ORDER).result(timeout=10)
    assert result is not None
    record = await dispatcher.host.get(verdict.instance_id)
    assert record.state is InstanceState.COMPLETED
    assert record.idempotency_key == "m-1"  # the broker's message id is the key


async def test_a_redelivery_starts_nothing_twice_and_a_header_key_beats_the_message_id(
    dispatcher: IngressDispatcher,
) -> None:
    first = await dispatcher.handle(start(order("o-1")))
    again = await dispatcher.handle(start(order("o-1")))
    assert isinstance(first, Started) and isinstance(again, Started)
    assert (again.instance_id, again.created) == (first.instance_id, False)
    keyed = await dispatcher.handle(
        start(order("o-2"), key="m-2", **{"flowx-idempotency-key": "order-2"})
    )
    keyed_again = await dispatcher.handle(
        start(order("o-2"), key="m-3", **{"flowx-idempotency-key": "order-2"})
    )
    assert isinstance(keyed, Started) and isinstance(keyed_again, Started)
    assert keyed_again.instance_id == keyed.instance_id and not keyed_again.created
    assert len(await instances(dispatcher)) == 2


async def test_the_flow_header_and_version_header_name_the_flow_over_the_routing_key(
    dispatcher: IngressDispatcher,
) -> None:
    d = Delivery(
        body=order("o-9"),
        message_id="m-9",
        headers={"flowx-flow": "ing.order", "flowx-version": "1"},
        subject="anything",
    )
    verdict = await dispatcher.handle(d)
    assert isinstance(verdict, Started)
    assert (await dispatcher.host.get(verdict.instance_id)).flow_id == "ing.order"


@pytest.mark.parametrize(
    ("delivery", "code", "says"),
    [
        (start(b"\xff\xfe"), "ingress.not_json", "not UTF-8"),
        (start(b"{not json"), "ingress.not_json", "not JSON"),
        (start(b'{"order_id": NaN}'), "ingress.not_json", "NaN"),
        (start(order(), key=None), "ingress.no_key", "flowx-idempotency-key"),
        (start(order("x" * 300)), "ingress.too_large", "over the limit of 200"),
        (
            Delivery(body=order(), message_id="m", subject="shop.ing.nothing"),
            "ingress.unknown_flow",
            "ing.nothing",
        ),
        (start(order(), **{"flowx-version": "9"}), "ingress.unknown_flow", "ing.order@9"),
        (Delivery(body=order(), message_id="m", subject=""), "ingress.unknown_flow", "empty"),
        (start(b'{"quantity": 2}'), "ingress.input_invalid", "field 'order_id'"),
        (start(b"[1, 2]"), "ingress.input_invalid", "ing.order"),
    ],
)
async def test_a_poison_start_is_dead_with_a_stable_code_and_a_reason(
    dispatcher: IngressDispatcher, delivery: Delivery, code: str, says: str
) -> None:
    before = metrics.INGRESS_MESSAGES.get("dead")
    verdict = await dispatcher.handle(delivery)
    assert isinstance(verdict, Dead)
    assert verdict.code == code
    assert says in verdict.reason
    assert "\n" not in verdict.reason
    assert metrics.INGRESS_MESSAGES.get("dead") == before + 1
    assert await instances(dispatcher) == []  # nothing was started


async def test_an_invalid_input_is_dead_without_the_value_it_carried(
    dispatcher: IngressDispatcher,
) -> None:
    verdict = await dispatcher.handle(start(b'{"order_id": "o", "quantity": "hunter2-secret"}'))
    assert isinstance(verdict, Dead) and verdict.code == "ingress.input_invalid"
    assert "field 'quantity'" in verdict.reason
    assert "hunter2" not in verdict.reason


async def test_a_key_reused_with_another_input_is_a_conflict(
    dispatcher: IngressDispatcher,
) -> None:
    assert isinstance(await dispatcher.handle(start(order("o-1"))), Started)
    verdict = await dispatcher.handle(start(order("o-other")))
    assert isinstance(verdict, Dead) and verdict.code == "ingress.conflict"
    assert len(await instances(dispatcher)) == 1


def signal(
    instance_id: str | None, body: bytes, *, key: str = "s-1", name: str = "paid"
) -> Delivery:
    headers = {"flowx-signal": name}
    if instance_id is not None:
        headers["flowx-instance"] = instance_id
    return Delivery(body=body, message_id=key, headers=headers, subject="shop.signals")


async def test_a_signal_message_wakes_the_waiting_instance_and_its_redelivery_is_a_duplicate(
    dispatcher: IngressDispatcher,
) -> None:
    host = dispatcher.host
    started = await host.start("ing.wait", {"order_id": "w-1"}, idempotency_key="w-1")
    store = host.store
    assert store is not None

    async def suspended() -> bool:
        return (await host.get(started.instance_id)).state is InstanceState.SUSPENDED

    await until(suspended, within=10, what="the instance waits for its signal")
    woken = await dispatcher.handle(signal(started.instance_id, b'{"amount": 5}'))
    assert woken == Signalled(started.instance_id, "woken")
    await started.result(timeout=10)
    again = await dispatcher.handle(signal(started.instance_id, b'{"amount": 5}'))
    assert again == Signalled(started.instance_id, "duplicate")


async def test_a_poison_signal_is_dead_with_a_stable_code(dispatcher: IngressDispatcher) -> None:
    host = dispatcher.host
    waiting = await host.start("ing.wait", {"order_id": "w-2"}, idempotency_key="w-2")
    ended = await host.start("ing.wait", {"order_id": "w-3"}, idempotency_key="w-3")

    async def suspended() -> bool:
        return (await host.get(ended.instance_id)).state is InstanceState.SUSPENDED

    await until(suspended, within=10, what="the instance waits for its signal")
    await host.terminate(ended.instance_id, "ended before its signal came")

    async def terminated() -> bool:
        return (await host.get(ended.instance_id)).state.terminal

    await until(terminated, within=10, what="the terminated instance ends")
    cases = {
        "ingress.no_instance": signal(None, b"{}"),
        "ingress.unknown_instance": signal("no-such-instance", b'{"amount": 1}'),
        "ingress.unknown_signal": signal(waiting.instance_id, b'{"amount": 1}', name="shipped"),
        "ingress.payload_invalid": signal(waiting.instance_id, b'{"amount": "lots"}'),
        "ingress.instance_finished": signal(ended.instance_id, b'{"amount": 1}'),
        "ingress.not_json": signal(waiting.instance_id, b"amount=1"),
    }
    for code, delivery in cases.items():
        verdict = await dispatcher.handle(delivery)
        assert isinstance(verdict, Dead), code
        assert verdict.code == code, verdict
    correlated = Delivery(
        body=b"{}",
        message_id="c",
        headers={"flowx-signal": "paid", "flowx-correlation": "order-7"},
    )
    verdict = await dispatcher.handle(correlated)
    assert isinstance(verdict, Dead) and verdict.code == "ingress.unknown_instance", verdict
    assert "correlation id 'order-7'" in verdict.reason


async def test_a_draining_host_leaves_the_message_for_a_redelivery(
    host_factory: MakeHost,
) -> None:
    host = await host_factory(*FLOWS)
    dispatcher = IngressDispatcher(host)
    await host.drain(timeout=1)
    before = metrics.INGRESS_MESSAGES.get("retry")
    with pytest.raises(IngressRetry) as caught:
        await dispatcher.handle(start(order()))
    assert caught.value.retryable and caught.value.code == "ingress.retry"
    assert metrics.INGRESS_MESSAGES.get("retry") == before + 1


def test_a_bound_below_one_byte_is_refused(host_factory: MakeHost) -> None:
    with pytest.raises(ValueError, match="max_bytes must be at least 1"):
        IngressDispatcher(object(), max_bytes=0)  # type: ignore[arg-type]


# -- our side down: never dead-lettered (SPEC §8) -------------------------------------------


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    target = urlsplit(PG_DSN)
    fault = FaultProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await fault.start()
    yield fault
    await fault.stop()


async def test_a_journal_that_goes_away_makes_the_message_wait_not_die(
    proxy: FaultProxy, pg_schema: Callable[[], str]
) -> None:
    target = urlsplit(PG_DSN)
    user = target.username or "postgres"
    url = f"postgresql://{user}:s3cret-Pa55@127.0.0.1:{proxy.port}{target.path}"
    store = postgres(url, schema=pg_schema(), connect_timeout=2, min_size=1, max_size=2)
    settings = flowx.HostSettings(lease_ttl="30s")
    host = flowx.FlowHost(
        store=store, flows=FLOWS, **fold_settings({"recovery": False, "settings": settings})
    )
    await host.open()
    try:
        dispatcher = IngressDispatcher(host)
        await proxy.refuse()
        with pytest.raises(IngressRetry) as caught:
            await dispatcher.handle(start(order("o-down"), key="down-1"))
        assert "s3cret" not in str(caught.value)
        assert caught.value.__cause__ is not None
        await proxy.forward()
        # The same message, redelivered (as a broker would, until it is taken) once the
        # journal is back, starts its instance; a further redelivery starts nothing more.
        verdicts: list[Started] = []

        async def taken() -> bool:
            try:
                verdict = await dispatcher.handle(start(order("o-down"), key="down-1"))
            except IngressRetry:
                return False
            assert isinstance(verdict, Started)
            verdicts.append(verdict)
            return True

        await until(taken, within=20, what="the redelivered message is taken")
        again = await dispatcher.handle(start(order("o-down"), key="down-1"))
        assert again == Started(verdicts[0].instance_id, created=False)
    finally:
        await host.drain(timeout=5)
