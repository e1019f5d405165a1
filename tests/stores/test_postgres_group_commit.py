"""Group commit on PostgreSQL: many instances per statement, each commit still its own
(R2.3, R2.4, R6.2, R9.5)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from flowx.stores.errors import DuplicateStep, FencedOut
from flowx.stores.postgres import PostgresStores
from flowx.stores.postgres.batching import Batcher, isolatable
from flowx.stores.records import StepCommit
from flowx.testing.conformance._support import at, event, instance, step
from tests.postgres_support import PG_DSN


async def test_a_batch_commits_each_instance_and_refuses_only_the_fenced(
    pg_schema: Callable[[], str],
) -> None:
    stores = PostgresStores(PG_DSN, schema=pg_schema())
    await stores.open()
    try:
        j = stores.journal
        ids = [
            (await j.create(instance(), token=1, now=at(0))).instance.instance_id
            for _ in range(120)
        ]
        zombies = set(ids[::10])
        for iid in zombies:  # another node took these over: token 1 is now stale
            await j.open(iid, token=2, now=at(1))
        results = await asyncio.gather(
            *(
                j.commit(
                    StepCommit(
                        instance_id=iid,
                        token=1,
                        now=at(2),
                        step=step(1),
                        state_bag=f'{{"n":{n}}}',
                        events=(event(key=iid),),
                    )
                )
                for n, iid in enumerate(ids)
            ),
            return_exceptions=True,
        )
        group = j._group  # type: ignore[attr-defined]
        assert group.batches >= 1 and group.batched_commits > 1  # batching really happened
        for n, (iid, outcome) in enumerate(zip(ids, results, strict=True)):
            record = await j.get(iid)
            if iid in zombies:
                assert isinstance(outcome, FencedOut)
                assert record.state_bag == "{}" and record.next_sequence == 1
                assert list(await j.events(iid)) == []
            else:
                assert outcome == 1
                assert record.state_bag == f'{{"n":{n}}}'
                assert record.state_bag_sequence == 1 and record.next_sequence == 2
                events = await j.events(iid)
                assert [(e.sequence, e.ordinal, e.partition_key) for e in events] == [(1, 0, iid)]
    finally:
        await stores.close()


async def test_a_duplicate_in_a_batch_fails_alone(pg_schema: Callable[[], str]) -> None:
    stores = PostgresStores(PG_DSN, schema=pg_schema())
    await stores.open()
    try:
        j = stores.journal
        ids = [
            (await j.create(instance(), token=1, now=at(0))).instance.instance_id for _ in range(40)
        ]
        await j.commit(StepCommit(instance_id=ids[7], token=1, now=at(1), step=step(1)))
        results = await asyncio.gather(
            *(
                j.commit(StepCommit(instance_id=iid, token=1, now=at(2), step=step(1)))
                for iid in ids
            ),
            return_exceptions=True,
        )
        assert isinstance(results[7], DuplicateStep)
        assert all(r == 1 for i, r in enumerate(results) if i != 7)
        assert len(await j.steps(ids[7])) == 1
    finally:
        await stores.close()


@pytest.mark.parametrize(
    ("culprit", "refused_as"),
    [
        # Refused by the server: text the `json` type does not accept (a DataError).
        ({"step": step(1, result='{"half": ')}, psycopg.DataError),
        # Refused by the driver before anything is sent: NUL in text, a lone surrogate.
        ({"step": step(1), "state_bag": '"a\x00b"'}, psycopg.DataError),
        ({"step": step(1), "events": (event(payload='"\ud800"'),)}, UnicodeEncodeError),
    ],
    ids=["server-json", "client-nul", "client-surrogate"],
)
async def test_a_value_the_database_refuses_fails_alone_and_its_batch_commits_once(
    pg_schema: Callable[[], str], culprit: dict[str, Any], refused_as: type[Exception]
) -> None:
    """R9.5: one commit whose data PostgreSQL (or psycopg) refuses fails the batched
    statement; the batch is retried commit by commit, so only that commit gets the error and
    every neighbour commits untouched, exactly once. (The codec refuses such values before
    they get here; this is the seam behind it, driven with a hand-made StepCommit.)"""
    stores = PostgresStores(PG_DSN, schema=pg_schema())
    await stores.open()
    try:
        j = stores.journal
        ids = [
            (await j.create(instance(), token=1, now=at(0))).instance.instance_id for _ in range(40)
        ]
        bad = 30  # the first commits go out alone; this one is in the batch behind them

        def commit_of(n: int, iid: str) -> StepCommit:
            if n == bad:
                return StepCommit(instance_id=iid, token=1, now=at(2), **culprit)
            return StepCommit(
                instance_id=iid,
                token=1,
                now=at(2),
                step=step(1, result=f'{{"n":{n}}}'),
                state_bag=f'{{"n":{n}}}',
                events=(event(key=iid),),
            )

        results = await asyncio.gather(
            *(j.commit(commit_of(n, iid)) for n, iid in enumerate(ids)),
            return_exceptions=True,
        )
        group = j._group  # type: ignore[attr-defined]
        assert group.fallbacks >= 1  # the culprit's batch really failed as a whole
        assert isinstance(results[bad], refused_as), results[bad]
        record = await j.get(ids[bad])
        assert record is not None
        assert (record.next_sequence, record.state_bag) == (1, "{}")
        assert list(await j.steps(ids[bad])) == [] and list(await j.events(ids[bad])) == []
        for n, (iid, outcome) in enumerate(zip(ids, results, strict=True)):
            if n == bad:
                continue
            assert outcome == 1, (n, outcome)
            record = await j.get(iid)
            assert record is not None
            assert (record.next_sequence, record.state_bag) == (2, f'{{"n":{n}}}')
            assert [(s.sequence, s.result) for s in await j.steps(iid)] == [(1, f'{{"n":{n}}}')]
            assert len(await j.events(iid)) == 1
    finally:
        await stores.close()


@pytest.mark.parametrize(
    ("exc", "alone"),
    [
        (psycopg.errors.InvalidTextRepresentation("json"), True),
        (psycopg.errors.UntranslatableCharacter("\\u0000"), True),
        (psycopg.DataError("NUL"), True),
        (psycopg.errors.UniqueViolation("dup"), True),
        (psycopg.errors.DeadlockDetected("deadlock"), True),
        (psycopg.errors.SerializationFailure("serialise"), True),
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), True),
        (psycopg.OperationalError("server closed the connection"), False),
        (psycopg.errors.QueryCanceled("statement timeout"), False),
        (psycopg.errors.AdminShutdown("terminating"), False),
        (psycopg.InterfaceError("connection is closed"), False),
        (TimeoutError(), False),
        (ConnectionResetError(), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_only_an_error_about_one_commits_data_is_retried_commit_by_commit(
    exc: Exception, alone: bool
) -> None:
    """R9.5: the batch is re-sent commit by commit only when it certainly wrote nothing; a
    connection lost or a statement cancelled leaves its outcome unknown, for recovery."""
    assert isolatable(exc) is alone


def test_a_batcher_serves_the_loop_it_is_used_from_after_another_closed() -> None:
    """The batcher keeps the loop it found (asking for it costs a ``getpid`` system call per
    write on CPython 3.11), but only while that loop runs: used again from a new loop (a
    store reopened by another ``asyncio.run``), its futures and batches belong to the new
    one."""
    sent: list[list[int]] = []

    async def one(item: int) -> int:
        sent.append([item])
        return item * 10

    async def many(items: list[int]) -> list[int | Exception]:
        sent.append(list(items))
        await asyncio.sleep(0.01)  # writes queue behind a batch in flight
        return [i * 10 for i in items]

    batcher: Batcher[int, int] = Batcher(one, many, key=lambda i: i, spill=2)

    async def use(base: int) -> list[int]:
        loop = asyncio.get_running_loop()
        futures = [batcher.submit(base + n) for n in range(5)]
        assert all(f.get_loop() is loop for f in futures)
        return list(await asyncio.gather(*futures))

    assert asyncio.run(use(0)) == [0, 10, 20, 30, 40]
    assert asyncio.run(use(100)) == [1000, 1010, 1020, 1030, 1040]
    assert sorted(i for batch in sent for i in batch) == [0, 1, 2, 3, 4, 100, 101, 102, 103, 104]
    assert any(len(batch) > 1 for batch in sent)  # batches formed in both loops' runs


def test_a_batcher_used_from_a_new_loop_still_lets_writes_past_a_hung_batch() -> None:
    """A patience timer left armed when its loop closed fires nowhere: in the new loop the
    writes behind a hung batch must still get a lane of their own once ``patience`` runs out
    (R9.1), not wait for the hung batch forever."""
    hung: dict[str, asyncio.Event] = {}

    async def one(item: int) -> int:
        if item == 100:
            release = hung["release"] = asyncio.Event()
            await release.wait()  # a batch whose reply does not come
        return item

    async def many(items: list[int]) -> list[int | Exception]:
        await asyncio.sleep(0.01)
        return list(items)

    batcher: Batcher[int, int] = Batcher(one, many, key=lambda i: i, spill=10, patience=60)

    async def first() -> None:  # writes queue behind a batch: a timer is armed, never fired
        assert await asyncio.gather(*(batcher.submit(n) for n in range(5))) == [0, 1, 2, 3, 4]

    async def second() -> None:
        batcher._patience = 0.05
        stuck = batcher.submit(100)
        behind = batcher.submit(101)
        async with asyncio.timeout(5):
            assert await behind == 101
        assert not stuck.done()
        hung["release"].set()
        assert await stuck == 100

    asyncio.run(first())
    asyncio.run(second())
