"""Signal deliveries group-committed on PostgreSQL answer exactly as one at a time (R2.10, R6.2).

Two copies of the same scene — an instance waiting for the signal, one running, one whose key
was seen, one whose only wait is spoken for, one that has ended (with and without a repeated
key), an id that names nothing — get the same deliveries: one copy one delivery per
transaction (``deliver_one``), the other all in one batch (``deliver_many``). Receipts, errors,
inboxes and instance states must match, row for row.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from flowx.stores.errors import InstanceFinished, UnknownInstance
from flowx.stores.postgres import PostgresStores
from flowx.stores.postgres.signals import Delivery, deliver_many, deliver_one
from flowx.stores.records import InstanceState, SignalReceipt
from flowx.testing.conformance._support import (
    at,
    commit,
    make_instance,
    new_id,
    step,
    suspend_commit,
)
from tests.postgres.support import aconnect
from tests.postgres_support import PG_DSN


async def _scene(stores: PostgresStores) -> list[Delivery]:
    """Instances in every case a delivery must tell apart, and one delivery to each."""
    j, w = stores.journal, stores.waits
    waiting = await make_instance(stores)
    await w.suspend(suspend_commit(waiting, signal="go"))
    running = await make_instance(stores)
    seen_key = await make_instance(stores)
    await w.signal(seen_key, "go", '{"n":0}', key="k", now=at(6))
    spoken_for = await make_instance(stores)
    await w.signal(spoken_for, "go", '{"n":0}', key=None, now=at(6))
    ended = await make_instance(stores)
    await j.commit(commit(ended, token=1, now=2, step=step(1), state=InstanceState.COMPLETED))
    ended_key = await make_instance(stores)
    await w.signal(ended_key, "go", '{"n":0}', key="k", now=at(6))
    await j.commit(commit(ended_key, token=1, now=7, step=step(1), state=InstanceState.COMPLETED))

    def to(iid: str, *, key: str | None = None, limit: int | None = None) -> Delivery:
        return Delivery(iid, "go", '{"n": 1}', key, at(8), limit)

    return [
        to(waiting, limit=1),
        to(running, key="r"),
        to(seen_key, key="k"),
        to(spoken_for, limit=1),
        to(ended),
        to(ended_key, key="k"),
        to(new_id()),
    ]


def _shape(outcome: SignalReceipt | Exception) -> tuple[Any, ...]:
    if isinstance(outcome, Exception):
        return (type(outcome).__name__,)
    return (outcome.status, outcome.state, outcome.seq > 0)


async def _after(stores: PostgresStores, d: Delivery) -> tuple[Any, ...]:
    record = await stores.journal.get(d.instance_id)
    inbox = await stores.waits.signals(d.instance_id, d.name)
    return (
        record.state if record else None,
        [(s.key, s.payload) for s in inbox],
    )


async def test_a_batch_of_deliveries_answers_as_deliveries_one_by_one(
    pg_schema: Callable[[], str],
) -> None:
    stores = PostgresStores(PG_DSN, schema=pg_schema())
    await stores.open()
    try:
        db = stores.journal._db  # type: ignore[attr-defined]
        alone_scene, batch_scene = await _scene(stores), await _scene(stores)
        alone: list[SignalReceipt | Exception] = []
        for d in alone_scene:
            try:
                alone.append(await deliver_one(db, d))
            except (UnknownInstance, InstanceFinished) as exc:
                alone.append(exc)
        batched = await deliver_many(db, batch_scene)
        assert [_shape(o) for o in batched] == [_shape(o) for o in alone]
        assert [_shape(o) for o in alone] == [
            ("woken", InstanceState.PENDING, True),
            ("kept", InstanceState.RUNNING, True),
            ("duplicate", InstanceState.RUNNING, True),
            ("duplicate", InstanceState.RUNNING, True),
            ("InstanceFinished",),
            ("duplicate", InstanceState.COMPLETED, True),
            ("UnknownInstance",),
        ]
        for a, b in zip(alone_scene, batch_scene, strict=True):
            assert await _after(stores, a) == await _after(stores, b)
        # A repeated key answers with the first copy's seq, as one by one does.
        [first] = await stores.waits.signals(batch_scene[2].instance_id, "go")
        assert isinstance(batched[2], SignalReceipt) and batched[2].seq == first.seq
    finally:
        await stores.close()


async def test_a_delivery_the_server_refuses_fails_alone(pg_schema: Callable[[], str]) -> None:
    """A payload the ``json`` type refuses fails its own delivery; the rest of its batch
    lands (R9.5)."""
    schema = pg_schema()
    stores = PostgresStores(PG_DSN, schema=schema)
    await stores.open()
    holder = await aconnect(schema)
    try:
        ids = [await make_instance(stores) for _ in range(12)]
        for iid in ids:
            await stores.waits.suspend(suspend_commit(iid, signal="go"))
        # Hold the first rows so later deliveries queue behind them and go out as batches.
        async with holder.transaction():
            await holder.execute(
                "SELECT 1 FROM flow_instance WHERE instance_id = ANY (%s::uuid[]) FOR UPDATE",
                (ids[:4],),
            )
            sends = [
                asyncio.ensure_future(
                    stores.waits.signal(
                        iid, "go", "not json" if n == 7 else f'{{"n":{n}}}', key=None, now=at(6)
                    )
                )
                for n, iid in enumerate(ids)
            ]
            await _until_queued(stores, len(ids) - 4)
        outcomes = await asyncio.gather(*sends, return_exceptions=True)
        batcher = stores.waits._signals  # type: ignore[attr-defined]
        assert batcher.fallbacks >= 1  # the bad payload's batch was retried one by one
        for n, (iid, outcome) in enumerate(zip(ids, outcomes, strict=True)):
            if n == 7:
                assert isinstance(outcome, Exception) and "json" in str(outcome).lower()
                assert (await stores.journal.get(iid)).state is InstanceState.SUSPENDED
            else:
                assert isinstance(outcome, SignalReceipt) and outcome.status == "woken"
    finally:
        await holder.close()
        await stores.close()


async def _until_queued(stores: PostgresStores, count: int, timeout: float = 10.0) -> None:
    """Bounded: until ``count`` deliveries wait in the batcher behind those in flight."""
    batcher = stores.waits._signals  # type: ignore[attr-defined]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while len(batcher._pending) < count:
        if loop.time() > end:
            pytest.fail(f"{len(batcher._pending)} deliveries queued, expected {count}")
        await asyncio.sleep(0.01)


async def test_a_claim_reads_the_inbox_of_a_woken_wait_with_the_steps(
    pg_schema: Callable[[], str],
) -> None:
    """A claimed instance woken at a signal wait comes with that name's inbox, read in the
    claim's second round trip (the run's first look needs no read of its own); one that waits
    for nothing comes without (``None``: not read)."""
    stores = PostgresStores(PG_DSN, schema=pg_schema())
    await stores.open()
    try:
        woken = await make_instance(stores)
        await stores.waits.suspend(suspend_commit(woken, signal="go"))
        await stores.waits.signal(woken, "go", '{"n": 1}', key="a", now=at(6))
        await stores.waits.signal(woken, "other", '{"n": 2}', key=None, now=at(6))
        queued = await make_instance(stores, state=InstanceState.PENDING)
        claimed = await stores.claim_queued(
            owner="n1", ttl=timedelta(seconds=30), limit=10, flows=None, now=at(7)
        )
        histories = {lease.instance_id: history for lease, history in claimed}
        assert set(histories) == {woken, queued}
        inbox = histories[woken].inbox
        assert inbox is not None and [(s.name, s.key) for s in inbox] == [("go", "a")]
        assert histories[queued].inbox is None
    finally:
        await stores.close()
