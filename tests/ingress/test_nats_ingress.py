"""The NATS JetStream ingress against the real server (R6.1, R9.9; SPEC §8 "poison message at
ingress"): each test has a stream and consumer of its own, deleted after it. Hosts run on the
in-memory store, except the worker processes' (PostgreSQL). Connections, TLS and URLs:
``test_nats_connections.py``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import psycopg
import pytest

import flowx
from flowx.ingress import Dead, Delivery, IngressRetry, Signalled, Started
from flowx.ingress.nats_jetstream import NatsIngressUnavailable, NatsJetStreamIngress
from tests.ingress.flows import FLOWS
from tests.ingress.jetstream import (
    Recording,
    Stream,
    completed,
    consuming,
    instances,
    order,
    own_stream,
)
from tests.ingress.test_worker_processes import N, states, stop, worker
from tests.postgres_support import PG_DSN
from tests.support.polling import until, until_sync

ROOT = Path(__file__).resolve().parents[2]
MakeHost = Callable[..., Any]


@pytest.fixture
async def stream() -> AsyncIterator[Stream]:
    async with own_stream() as made:
        yield made


async def test_a_message_starts_an_instance_that_completes_and_is_acked(
    stream: Stream, host_factory: MakeHost
) -> None:
    host = await host_factory(*FLOWS)
    await stream.publish(order("o-1"))
    await stream.publish(order("o-2"), **{"Nats-Msg-Id": "publisher-7"})
    async with consuming(stream.url(), Recording(host)):
        await until(lambda: completed(host, 2), within=10, what="both instances completed")
        await until(stream.drained, within=10, what="both messages acked")
    keys = sorted(r.idempotency_key for r in await instances(host))
    # The publisher's id when it gave one; else the stream sequence, stable on redelivery.
    assert keys[1] == "publisher-7"
    assert keys[0].startswith(f"nats:{stream.name}:") and keys[0].endswith(":1")
    info = await stream.consumer()
    assert (info.num_redelivered, info.config.ack_policy) == (0, "explicit")


async def test_a_redelivery_after_a_lost_ack_starts_nothing_twice(
    stream: Stream, host_factory: MakeHost
) -> None:
    class LosesFirstAck(Recording):
        """Commits the start, then fails as a worker dying before its ack would."""

        async def handle(self, d: Delivery) -> Any:
            verdict = await super().handle(d)
            if len(self.verdicts) == 1:
                raise IngressRetry("killed between commit and ack")
            return verdict

    host = await host_factory(*FLOWS)
    dispatcher = LosesFirstAck(host)
    await stream.publish(order("o-1"))
    async with consuming(stream.url(), dispatcher):
        await until(stream.drained, within=10, what="the redelivered message acked")
    (first_d, first), (again_d, again) = dispatcher.verdicts
    assert isinstance(first, Started) and first.created and not first_d.redelivered
    assert again == Started(first.instance_id, False) and again_d.redelivered
    assert again_d.message_id == first_d.message_id
    assert len(await instances(host)) == 1


async def test_the_same_nats_msg_id_stored_twice_starts_one_instance(
    stream: Stream, host_factory: MakeHost
) -> None:
    host = await host_factory(*FLOWS)
    await stream.publish(order("o-1"), **{"Nats-Msg-Id": "order-1"})

    async def stored_again() -> bool:  # past the stream's 0.2 s duplicate window
        ack = await stream.publish(order("o-1"), **{"Nats-Msg-Id": "order-1"})
        return not ack.duplicate

    await until(stored_again, within=10, what="the second copy stored", every=0.05)
    dispatcher = Recording(host)
    async with consuming(stream.url(), dispatcher):
        await until(stream.drained, within=10, what="both copies acked")
    first, again = dispatcher.started()
    assert first.created and again == Started(first.instance_id, False)
    assert len(await instances(host)) == 1


async def test_each_poison_kind_is_dead_lettered_and_a_good_message_still_completes(
    stream: Stream, host_factory: MakeHost
) -> None:
    host = await host_factory(*FLOWS)
    trace = {"x-trace": "t-1"}
    poison: list[tuple[str, bytes, str, dict[str, str]]] = [
        ("ingress.not_json", b"{nope", "ing.order", {}),
        ("ingress.not_json", b"\xff\xfe", "ing.order", {}),
        ("ingress.too_large", order("o", pad="x" * 300), "ing.order", {}),
        ("ingress.unknown_flow", order("o"), "no_such_flow", {}),
        ("ingress.input_invalid", b'{"quantity": "many"}', "ing.order", {}),
        ("ingress.no_instance", b"{}", "ing.wait", {"flowx-signal": "paid"}),
        (
            "ingress.unknown_instance",
            b'{"amount": 1}',
            "ing.wait",
            {"flowx-signal": "paid", "flowx-instance": "no-such-instance"},
        ),
    ]
    for _, body, flow, headers in poison:
        await stream.publish(body, flow, **trace, **headers)
    # The same key with another input: whichever comes second is the conflict.
    await stream.publish(order("c-1"), **{"flowx-idempotency-key": "k-c"})
    await stream.publish(order("c-2"), **{"flowx-idempotency-key": "k-c"})
    await stream.publish(order("good"))
    async with consuming(stream.url(), Recording(host, max_bytes=200)):
        await until(stream.drained, within=10, what="every message settled")
        await until(lambda: completed(host, 2), within=10, what="the good ones completed")
    letters = await stream.dead_letters()
    assert sorted(m.headers["flowx-dead-code"] for m in letters) == sorted(
        [code for code, *_ in poison] + ["ingress.conflict"]
    )
    by_body = {m.data: m for m in letters}
    for code, body, flow, headers in poison:
        letter = by_body[body]
        assert letter.headers["flowx-dead-code"] == code
        assert letter.headers["flowx-dead-reason"]  # one readable line saying why
        assert letter.headers["x-trace"] == "t-1"  # the original headers travel with it
        assert {k: letter.headers[k] for k in headers} == headers
        assert letter.subject == f"flowx.dead.{stream.name}.{stream.prefix}.{flow}"
    assert (await stream.consumer()).num_redelivered == 0  # terminated, never redelivered


async def test_a_failed_dead_letter_publish_leaves_the_message_for_later(
    stream: Stream, host_factory: MakeHost
) -> None:
    from nats.js import api

    host = await host_factory(*FLOWS)
    dispatcher = Recording(host)
    jsm = stream.nc.jetstream()._jsm
    async with consuming(stream.url(), dispatcher):
        dead_stream = await jsm.stream_info(f"{stream.name}_DEAD")
        await jsm.delete_stream(f"{stream.name}_DEAD")  # nothing captures a dead letter now
        await stream.publish(b"{nope")
        await until(lambda: len(dispatcher.verdicts) >= 2, within=10, what="a redelivery")
        assert not await stream.drained()  # nak'ed, not terminated
        await jsm.add_stream(
            api.StreamConfig(name=dead_stream.config.name, subjects=dead_stream.config.subjects)
        )
        await until(stream.drained, within=10, what="the message dead-lettered at last")
    assert await stream.dead_count() == 1
    assert all(isinstance(v, Dead) for _, v in dispatcher.verdicts)


async def test_a_poison_body_at_the_payload_limit_is_dead_lettered_without_it(
    stream: Stream, host_factory: MakeHost
) -> None:
    limit = stream.nc.max_payload
    body = b"x" * (limit - 100)  # fits alone, not with the dead-letter headers
    await stream.publish(body)
    dispatcher = Recording(await host_factory(*FLOWS), max_bytes=limit)
    async with consuming(stream.url(), dispatcher):
        await until(stream.drained, within=10, what="the big poison message settled")
    (letter,) = await stream.dead_letters()
    assert letter.data in (b"", None)
    assert letter.headers["flowx-dead-code"] == "ingress.not_json"
    assert letter.headers["flowx-dead-body-dropped"].startswith(f"{len(body)} bytes")


async def test_two_dispatchers_on_one_durable_consumer_share_the_messages(
    stream: Stream, host_factory: MakeHost
) -> None:
    settings = flowx.HostSettings.load(max_concurrent_flows=2)
    one = Recording(await host_factory(*FLOWS, settings=settings))
    two = Recording(await host_factory(*FLOWS, settings=settings))
    gate = asyncio.Event()
    one.gate = two.gate = gate  # each holds at most its 2 slots until both hold one
    for i in range(20):
        await stream.publish(order(f"o-{i}"))
    async with consuming(stream.url(), one), consuming(stream.url(), two):
        await until(lambda: one.holding and two.holding, within=10, what="both took some")
        gate.set()
        await until(stream.drained, within=20, what="all 20 acked")
    assert one.started() and two.started()
    assert sum(s.created for s in one.started() + two.started()) == 20
    assert len(await instances(one.host)) == 20


async def test_no_free_slot_fetches_nothing_and_a_fetch_takes_only_the_free_slots(
    stream: Stream, host_factory: MakeHost
) -> None:
    class Slots(Recording):
        room = 0
        asked = 0

        def free_slots(self) -> int:
            self.asked += 1
            return self.room

    dispatcher = Slots(await host_factory(*FLOWS))
    dispatcher.gate = asyncio.Event()
    for i in range(3):
        await stream.publish(order(f"o-{i}"))
    async with consuming(stream.url(query="batch=64"), dispatcher):
        seen = dispatcher.asked
        await until(lambda: dispatcher.asked > seen + 2, within=10, what="the loop went round")
        info = await stream.consumer()
        assert (info.num_pending, info.num_ack_pending, dispatcher.holding) == (3, 0, 0)
        dispatcher.room = 2
        await until(lambda: dispatcher.holding == 2, within=10, what="two messages taken")
        seen = dispatcher.asked
        await until(lambda: dispatcher.asked > seen + 2, within=10, what="the loop went round")
        info = await stream.consumer()
        assert (info.num_pending, info.num_ack_pending, dispatcher.holding) == (1, 2, 2)
        dispatcher.room = 64
        dispatcher.gate.set()
        await until(stream.drained, within=10, what="all three acked")
    assert len(dispatcher.started()) == 3


async def test_a_consumer_with_one_message_out_hands_them_out_in_order_even_on_retry(
    stream: Stream, host_factory: MakeHost
) -> None:
    class FailsFirstTry(Recording):
        """Our side down for the first message's first delivery: it is nak'ed."""

        async def handle(self, d: Delivery) -> Any:
            if d.message_id == "m-0" and not d.redelivered:
                raise IngressRetry("the journal is down")
            return await super().handle(d)

    one, two = FailsFirstTry(await host_factory(*FLOWS)), FailsFirstTry(await host_factory(*FLOWS))
    two.verdicts = one.verdicts  # one log, in the order the two workers handled them
    for i in range(6):
        await stream.publish(order(f"o-{i}"), **{"Nats-Msg-Id": f"m-{i}"})
    url = stream.url("ordered", query="max_ack_pending=1")
    async with consuming(url, one), consuming(url, two):
        await until(lambda: stream.drained("ordered"), within=20, what="all six acked")
    assert [d.message_id for d, _ in one.verdicts] == [f"m-{i}" for i in range(6)]


async def test_a_filtered_consumer_takes_only_its_subjects(
    stream: Stream, host_factory: MakeHost
) -> None:
    host = await host_factory(*FLOWS)
    await stream.publish(order("a"), "a.ing.order")
    await stream.publish(order("b"), "b.ing.order")
    dispatcher = Recording(host)
    url = stream.url("only-a", query=f"filter={stream.prefix}.a.>")
    async with consuming(url, dispatcher):
        await until(lambda: stream.drained("only-a"), within=10, what="the a message acked")
        await until(lambda: completed(host, 1), within=10, what="the a instance completed")
    assert [d.subject for d, _ in dispatcher.verdicts] == [f"{stream.prefix}.a.ing.order"]
    with pytest.raises(NatsIngressUnavailable, match="not the URL's filter"):
        await NatsJetStreamIngress(stream.url("only-a", query="filter=other.>")).start(dispatcher)


async def test_a_long_handle_keeps_its_message_with_in_progress(
    stream: Stream, host_factory: MakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nats.aio.msg import Msg

    progress: list[Any] = []
    real = Msg.in_progress

    async def counted(msg: Msg) -> None:
        progress.append(msg)
        await real(msg)

    monkeypatch.setattr(Msg, "in_progress", counted)
    dispatcher = Recording(await host_factory(*FLOWS))
    dispatcher.gate = asyncio.Event()
    await stream.publish(order("slow"))
    async with consuming(stream.url(query="ack_wait=1"), dispatcher):
        # Six keep-alives, a third of AckWait apart: twice the AckWait has passed.
        await until(lambda: len(progress) >= 6, within=15, what="six in-progress acks")
        info = await stream.consumer()
        assert (info.num_redelivered, info.num_ack_pending, dispatcher.holding) == (0, 1, 1)
        dispatcher.gate.set()
        await until(stream.drained, within=10, what="the slow message acked")
    assert len(dispatcher.verdicts) == 1  # handled once: never redelivered meanwhile


async def test_a_signal_by_message_wakes_the_instance_and_its_redelivery_is_a_duplicate(
    stream: Stream, host_factory: MakeHost
) -> None:
    host = await host_factory(*FLOWS)
    dispatcher = Recording(host)
    async with consuming(stream.url(), dispatcher):
        await stream.publish(order("w-1"), "ing.wait")
        await until(lambda: dispatcher.started(), within=10, what="the waiter started")
        instance_id = dispatcher.started()[0].instance_id
        signal_headers = {
            "flowx-signal": "paid",
            "flowx-instance": instance_id,
            "flowx-idempotency-key": "pay-1",
        }
        await stream.publish(b'{"amount": 5}', "ing.wait", **signal_headers)
        await until(lambda: completed(host, 1), within=10, what="the signalled instance ended")
        await stream.publish(b'{"amount": 5}', "ing.wait", **signal_headers)
        await until(lambda: len(dispatcher.verdicts) == 3, within=10, what="the second signal")
        await until(stream.drained, within=10, what="all three acked")
    statuses = [v.status for _, v in dispatcher.verdicts if isinstance(v, Signalled)]
    assert statuses[0] in ("woken", "kept") and statuses[1] == "duplicate"
    assert await stream.dead_count() == 0


@pytest.mark.crash
async def test_a_worker_killed_mid_batch_loses_no_message(
    stream: Stream, pg_schema: Callable[[], str]
) -> None:
    db = f"{PG_DSN}?flowx_schema={pg_schema()}"
    n = 20
    for i in range(n):
        await stream.publish(order(f"o-{i}"))
    env = {
        **os.environ,
        "FLOWX_LEASE_TTL": "2s",
        "FLOWX_MAX_CONCURRENT_FLOWS": "8",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    worker = subprocess.Popen(  # noqa: ASYNC220 - a process of its own, killed below
        [
            sys.executable,
            "-m",
            "tests.ingress.nats_worker",
            db,
            stream.url(query="ack_wait=2"),
            "3",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # Committed and acked, then committed but held unacked: the kill lands mid-batch.
        async def mid_batch() -> bool:
            assert worker.poll() is None, worker.stderr.read().decode() if worker.stderr else ""
            with suppress(Exception):
                info = await stream.consumer()
                acked = info.delivered.consumer_seq - info.num_ack_pending
                return bool(info.num_ack_pending >= 5 and acked >= 3)
            return False

        await until(mid_batch, within=30, what="the worker holding unacked messages")
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    settings = flowx.HostSettings.load(lease_ttl="2s", recovery_scan_interval="200ms")
    async with flowx.FlowHost(store=flowx.from_url(db), flows=FLOWS, settings=settings) as host:
        dispatcher = Recording(host)
        async with consuming(stream.url(), dispatcher):
            await until(lambda: completed(host, n), within=30, what="all 20 completed")
            await until(stream.drained, within=30, what="all 20 acked")
        keys = {r.idempotency_key for r in await instances(host)}
    assert len(keys) == n  # one instance per message: the redelivered ones started nothing
    assert any(not s.created for s in dispatcher.started())  # some were redeliveries


# -- configuration ----------------------------------------------------------------------------


@pytest.mark.crash
async def test_a_flowx_worker_killed_mid_batch_loses_no_message_and_the_next_drains_cleanly(
    stream: Stream, pg_schema: Callable[[], str], tmp_path: Path
) -> None:
    schema = pg_schema()
    db = f"{PG_DSN}?flowx_schema={schema}"
    url = stream.url(query="ack_wait=2")  # what the killed worker held comes back within 2 s
    first = worker(db, url, tmp_path / "first.ready", "--max-concurrent-flows", "2")
    second: subprocess.Popen[bytes] | None = None
    try:
        until_sync((tmp_path / "first.ready").exists, within=30, what="the first worker ready")
        for i in range(N):
            await stream.publish(order(f"o-{i}"), "ing.slow", **{"Nats-Msg-Id": f"m-{i}"})
        await until(lambda: sum(states(schema).values()) >= 3, within=30, what="some started")
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL
        assert sum(states(schema).values()) < N  # killed mid-batch: messages were left
        second = worker(db, url, tmp_path / "second.ready")
        await until(lambda: states(schema) == {"Completed": N}, within=60, what="all completed")
        await until(stream.drained, within=30, what="every message acked")
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0  # stopped consuming, drained, exited cleanly
    finally:
        for proc in (first, second):
            if proc is not None:
                stop(proc)
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        keys = conn.execute(f'SELECT idempotency_key FROM "{schema}".flow_instance').fetchall()
    assert sorted(k for (k,) in keys) == sorted(f"m-{i}" for i in range(N))
