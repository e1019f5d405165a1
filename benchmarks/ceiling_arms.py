"""The raw arms of ``benchmarks.ceiling``: B7's flows as FlowX's own SQL, sent by two drivers.

Kept apart from ``ceiling.py`` (the CLI, the interleaved rounds, the checks and the report) so
that what is measured, the writes and how they are batched, reads on its own.

``RawFlows`` does at the SQL level what a FlowX flow of ``steps`` no-op steps does (B7,
``journal_throughput``): its start, leased (``CREATE_LEASED`` alone, ``CREATE_LEASED_BATCH``
for starts that arrive together), one step commit per step (``COMMIT`` alone, ``COMMIT_BATCH``
with FlowX's ``batch_params`` for commits that arrive together; the last moves the instance to
Completed), then the lease release (``RELEASE_MANY``). The statements are imported from
``flowx.stores.postgres``, never copied, and their parameters built by FlowX's own helpers, so
that the ceiling follows the engine's SQL; the payloads are those B7's flow writes.

Group commit as FlowX does it, with one minimal batcher (``Group``) shared by both drivers, so
that what differs between the raw arms is the driver and not the batching: a write goes out at
once, alone, when a connection is free; writes that arrive while batches are in flight go
together in the next one (at most ``MAX_BATCH`` a batch, one instance once a batch), a batch
going beside one in flight only once ``SPILL`` writes wait. Commits and starts each have
``MAX_INFLIGHT`` connections (as ``GroupCommitter`` and ``Batcher``);
releases one batch at a time on one connection with ``synchronous_commit = off`` (as
``ReleaseBatcher`` on the lease store's connection). Connections are opened before the run and
held: no pool checkout per batch. Every statement is prepared.

The drivers (``Driver``): ``Psycopg`` (psycopg 3, autocommit, ``prepare=True``) and ``Asyncpg``
(the same SQL text, its ``%(name)s`` placeholders rewritten to ``$n`` by ``to_dollar``; asyncpg
is a measured-only dependency, imported only when its arm is made).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, LiteralString, Protocol, TypeVar
from uuid import uuid4

import psycopg
from psycopg.types.string import TextLoader

from flowx.stores.postgres.commit import COMMIT, COMMIT_BATCH, batch_params, commit_params
from flowx.stores.postgres.creates import CREATE_LEASED_BATCH
from flowx.stores.postgres.creates import batch_params as create_batch_params
from flowx.stores.postgres.leases import RELEASE_MANY
from flowx.stores.postgres.store import CREATE_LEASED, create_params
from flowx.stores.records import InstanceState, NewInstance, Outcome, StepCommit, StepWrite

#: FlowX's batching (commit.GroupCommitter, batching.Batcher, releases.ReleaseBatcher).
MAX_BATCH = 256
MAX_INFLIGHT = 4
#: A second batch goes beside one in flight only once this many writes wait (``Batcher``).
SPILL = 32
RELEASE_BATCH = 512
#: What a FlowHost leases a run for (HostSettings' default TTL), and as whom.
TTL = timedelta(seconds=30)
OWNER = f"ceiling:{os.getpid()}"
#: B7's flow (journal_throughput.make_plan): its id, version and capability.
FLOW_ID, FLOW_VERSION = "bench.flow", "1.0.0"
CAPABILITY, CAPABILITY_VERSION = "bench.noop", "1.0.0"

T = TypeVar("T")
Row = tuple[Any, ...]


class BenchError(Exception):
    """A statement's answer was not the one a correct run gets (a bug, not a slow run)."""


# --- the drivers: one connection kind each, the same SQL text --------------------------------


class Driver(Protocol):
    name: str

    async def connect(self, dsn: str, schema: str, *, asynchronous: bool = False) -> Any: ...

    async def run(self, conn: Any, query: LiteralString, params: Mapping[str, Any]) -> list[Row]:
        """Execute ``query`` (psycopg's ``%(name)s`` placeholders), prepared; its rows."""
        ...

    async def close(self, conn: Any) -> None: ...


class Psycopg:
    name = "psycopg"

    async def connect(
        self, dsn: str, schema: str, *, asynchronous: bool = False
    ) -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, options=f"-c search_path={schema} -c TimeZone=UTC"
        )
        # As FlowX's pool does (database._configure): payloads and ids come back as text.
        conn.adapters.register_loader("json", TextLoader)
        conn.adapters.register_loader("uuid", TextLoader)
        if asynchronous:
            await conn.execute("SET synchronous_commit = off")
        return conn

    async def run(
        self, conn: psycopg.AsyncConnection[Any], query: LiteralString, params: Mapping[str, Any]
    ) -> list[Row]:
        cur = await conn.execute(query, params, prepare=True)
        return await cur.fetchall()

    async def close(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.close()


_PLACEHOLDER = re.compile(r"%\((\w+)\)[sbt]|%%|%.?")


def to_dollar(query: str) -> tuple[str, tuple[str, ...]]:
    """``query`` with psycopg's ``%(name)s`` placeholders as ``$n``, and the names in ``$n``
    order: a name used twice keeps its number, as psycopg's own conversion does."""
    names: dict[str, int] = {}

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name is None:
            if m.group(0) == "%%":
                return "%"
            raise BenchError(f"untranslatable placeholder {m.group(0)!r} in {query[:60]!r}")
        number = names.setdefault(name, len(names) + 1)
        return f"${number}"

    return _PLACEHOLDER.sub(sub, query), tuple(names)


class Asyncpg:
    name = "asyncpg"

    def __init__(self) -> None:
        import asyncpg  # type: ignore[import-untyped,unused-ignore]

        self._asyncpg: Any = asyncpg
        self._translated: dict[str, tuple[str, tuple[str, ...]]] = {}

    async def connect(self, dsn: str, schema: str, *, asynchronous: bool = False) -> Any:
        settings = {"search_path": schema, "TimeZone": "UTC"}
        if asynchronous:
            settings["synchronous_commit"] = "off"
        # Prepared statements are cached per connection (statement_cache_size, default 100).
        return await self._asyncpg.connect(dsn, server_settings=settings)

    async def run(self, conn: Any, query: LiteralString, params: Mapping[str, Any]) -> list[Row]:
        translated = self._translated.get(query)
        if translated is None:
            translated = self._translated[query] = to_dollar(query)
        text, names = translated
        # Arrays are lists, JSON is text (asyncpg's default json codec), ids are str (its uuid
        # codec takes them), the TTL a timedelta: what FlowX's param builders hand psycopg.
        rows = await conn.fetch(text, *(params[n] for n in names))
        return [tuple(r) for r in rows]

    async def close(self, conn: Any) -> None:
        await conn.close()


# --- group commit, the same for both drivers --------------------------------------------------


class Group(Generic[T]):
    """FlowX's group-commit pattern, minimal: a lone write goes at once when nothing is in
    flight; what arrives meanwhile waits and goes in the next batch, a second connection
    taking one only once ``SPILL`` writes wait.
    ``one`` sends a lone write (``None``: batches of one too go through ``many``)."""

    def __init__(
        self,
        conns: list[Any],
        one: Callable[[Any, T], Awaitable[Any]] | None,
        many: Callable[[Any, list[T]], Awaitable[list[Any]]],
        *,
        key: Callable[[T], Hashable],
        max_batch: int,
    ) -> None:
        self._free = list(conns)
        self._conns = len(conns)
        self._one, self._many, self._key, self._max_batch = one, many, key, max_batch
        self._pending: deque[tuple[T, asyncio.Future[Any]]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0
        self.items = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def _running(self) -> asyncio.AbstractEventLoop:
        # As ``Batcher._running``: the loop found once, not a ``getpid`` call per write (3.11).
        loop = self._loop
        if loop is None or not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _idle(self) -> bool:
        return len(self._free) == self._conns

    async def submit(self, item: T) -> Any:
        future: asyncio.Future[Any] = self._running().create_future()
        self._pending.append((item, future))
        self._dispatch()
        return await future

    def _dispatch(self) -> None:
        while self._pending and self._free and (self._idle() or len(self._pending) >= SPILL):
            batch = self._take()
            task = self._running().create_task(self._run(self._free.pop(), batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[tuple[T, asyncio.Future[Any]]]:
        batch: list[tuple[T, asyncio.Future[Any]]] = []
        seen: set[Hashable] = set()
        kept: list[tuple[T, asyncio.Future[Any]]] = []
        while self._pending and len(batch) < self._max_batch:
            entry = self._pending.popleft()
            key = self._key(entry[0])
            if key in seen:
                kept.append(entry)
                continue
            seen.add(key)
            batch.append(entry)
        self._pending.extendleft(reversed(kept))
        return batch

    async def _run(self, conn: Any, batch: list[tuple[T, asyncio.Future[Any]]]) -> None:
        items = [item for item, _ in batch]
        try:
            if len(items) == 1 and self._one is not None:
                outcomes = [await self._one(conn, items[0])]
            else:
                outcomes = await self._many(conn, items)
            self.batches += 1
            self.items += len(items)
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                if not future.done():
                    future.set_result(outcome)
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        finally:
            self._free.append(conn)
            self._dispatch()


# --- one arm's writes, in FlowX's statements ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Release:
    instance_id: str
    token: int


class RawFlows:
    """B7's flows at the SQL level: leased start, step commits, release, group-committed."""

    def __init__(self, driver: Driver, dsn: str, schema: str, steps: int) -> None:
        self._driver, self._dsn, self._schema, self._steps = driver, dsn, schema, steps
        self._conns: list[Any] = []
        self.latencies: list[float] = []

    async def open(self) -> None:
        d = self._driver
        made = [await d.connect(self._dsn, self._schema) for _ in range(2 * MAX_INFLIGHT)]
        released = await d.connect(self._dsn, self._schema, asynchronous=True)
        self._conns = [*made, released]
        self.creates: Group[NewInstance] = Group(
            made[:MAX_INFLIGHT],
            self._create_one,
            self._create_many,
            key=lambda i: i.instance_id,
            max_batch=MAX_BATCH,
        )
        self.commits: Group[StepCommit] = Group(
            made[MAX_INFLIGHT:],
            self._commit_one,
            self._commit_many,
            key=lambda c: c.instance_id,
            max_batch=MAX_BATCH,
        )
        self.releases: Group[Release] = Group(
            [released],
            None,
            self._release_many,
            key=lambda r: r.instance_id,
            max_batch=RELEASE_BATCH,
        )

    async def close(self) -> None:
        for conn in self._conns:
            await self._driver.close(conn)

    async def _create_one(self, conn: Any, instance: NewInstance) -> int:
        # As PostgresJournal.create_one.
        params = {**create_params(instance, 0, None), "owner": OWNER, "ttl": TTL}
        rows = await self._driver.run(conn, CREATE_LEASED, params)
        # lease_token, lease_expires, lease_acquired, then the row (instance_id first).
        if len(rows) != 1 or rows[0][0] is None or rows[0][3] is None:
            raise BenchError(f"CREATE_LEASED did not create {instance.instance_id}: {rows}")
        return int(rows[0][0])

    async def _create_many(self, conn: Any, instances: list[NewInstance]) -> list[int]:
        # As creates.GroupCreator._many.
        params = create_batch_params(instances, owner=OWNER, ttl=TTL, now=None)
        rows = await self._driver.run(conn, CREATE_LEASED_BATCH, params)
        # ord, lease_token, lease_expires, then the row (instance_id first).
        if len(rows) != len(instances) or any(r[1] is None or r[3] is None for r in rows):
            raise BenchError(f"CREATE_LEASED_BATCH created fewer than {len(instances)}")
        return [int(r[1]) for r in rows]

    async def _commit_one(self, conn: Any, commit: StepCommit) -> int:
        # As commit.send_one and outcome_of: fence, seq, moved, staged.
        rows = await self._driver.run(conn, COMMIT, commit_params(commit))
        if len(rows) != 1 or rows[0][1] is None or not rows[0][2]:
            raise BenchError(f"COMMIT refused for {commit.instance_id}: {rows}")
        return int(rows[0][1])

    async def _commit_many(self, conn: Any, commits: list[StepCommit]) -> list[int]:
        # As GroupCommitter._send: ord, fence, seq.
        rows = await self._driver.run(conn, COMMIT_BATCH, batch_params(commits))
        if len(rows) != len(commits) or any(r[2] is None for r in rows):
            raise BenchError(f"COMMIT_BATCH refused some of {len(commits)}: {rows}")
        return [int(r[2]) for r in rows]

    async def _release_many(self, conn: Any, releases: list[Release]) -> list[None]:
        # As PostgresLeaseStore._release_many.
        params = {
            "ids": [r.instance_id for r in releases],
            "tokens": [r.token for r in releases],
            "nows": [None for _ in releases],
        }
        rows = await self._driver.run(conn, RELEASE_MANY, params)
        if len(rows) != len(releases):
            raise BenchError(f"RELEASE_MANY released {len(rows)} of {len(releases)}")
        return [None for _ in releases]

    async def flow(self, n: int) -> None:
        """One B7 flow: start, ``steps`` no-op steps (the last one completes), release."""
        instance_id = str(uuid4())
        token = await self.creates.submit(
            NewInstance(
                instance_id=instance_id,
                flow_id=FLOW_ID,
                flow_version=FLOW_VERSION,
                input=json.dumps({"n": n}, separators=(",", ":")),
                state_bag='{"last":null}',
            )
        )
        for i in range(self._steps):
            commit = StepCommit(
                instance_id=instance_id,
                token=token,
                now=None,
                step=StepWrite(
                    scope="",
                    step_id=i + 1,
                    attempt=1,
                    step_name=f"s{i}",
                    outcome=Outcome.SUCCESS,
                    result=str(n),
                    capability_id=CAPABILITY,
                    capability_version=CAPABILITY_VERSION,
                    duration_ms=0,
                ),
                state_bag=f'{{"last":{n}}}',
                state=InstanceState.COMPLETED if i == self._steps - 1 else None,
            )
            started = time.perf_counter()
            await self.commits.submit(commit)
            self.latencies.append(time.perf_counter() - started)
        await self.releases.submit(Release(instance_id, token))


async def run_flows(
    run: Callable[[int], Awaitable[None]], instances: int, concurrency: int
) -> None:
    """``instances`` flows, ``concurrency`` at a time (B7's gate)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(n: int) -> None:
        async with gate:
            await run(n)

    await asyncio.gather(*(one(n) for n in range(instances)))
