"""The raw ceiling of the step commit on PostgreSQL: FlowX's own SQL, group-committed, no engine.

At each concurrency C, C "flows" run at a time until ``--instances`` have run, each doing at the
SQL level what a FlowX flow of ``--steps`` no-op steps does (B7, ``journal_throughput``): its
start, leased (``CREATE_LEASED`` alone, ``CREATE_LEASED_BATCH`` for starts that arrive
together), then one step commit per step (``COMMIT`` alone, ``COMMIT_BATCH`` with FlowX's
``batch_params`` for commits that arrive together; the last moves the instance to Completed),
then the lease release (``RELEASE_MANY``). The statements are imported from
``flowx.stores.postgres``, never copied, and their parameters built by FlowX's own helpers;
the payloads are those B7's flow writes (input ``{"n":N}``, result ``N``, state bag
``{"last":N}``).

Group commit as FlowX does it, with one minimal batcher (``Group``) shared by both drivers:
a write goes out at once, alone, when a connection is free; writes that arrive while batches
are in flight go together in the next one (at most 256 a batch, one instance once a batch).
Commits and starts each have 4 connections (4 batches in flight, as ``GroupCommitter`` and
``Batcher``); releases one batch at a time on one connection with ``synchronous_commit = off``
(as ``ReleaseBatcher`` on the lease store's connection). Connections are opened before the run
and held: no pool checkout per batch. Every statement is prepared.

Arms, run in one process, interleaved round by round in alternating order, each on a fresh
schema migrated by FlowX itself (dropped at the end):

- ``psycopg``: psycopg 3 ``AsyncConnection``s, autocommit, ``prepare=True``;
- ``asyncpg``: the same SQL text, its ``%(name)s`` placeholders rewritten to ``$n`` exactly as
  psycopg does (a repeated name keeps its number); asyncpg prepares and caches every statement.
  Skipped if asyncpg is not installed (a measured-only dependency: ``pip install asyncpg``);
- ``engine``: B7 itself (``journal_throughput.run_level``), the real ``FlowHost``.

The raw arms warm up with one flow alone and then C at once (every connection's statements
prepared); the engine arm warms up as B7 does (one flow). Each run is checked afterwards: every
instance Completed with its step rows, every lease released.

    python -m benchmarks.ceiling --store postgresql://postgres@127.0.0.1:5432/test

Writes ``benchmarks/results/ceiling-<steps>steps.json`` (step-commits/s = steps x flows /
elapsed, and flows/s, per arm and C: medians over rounds; the ratios engine/psycopg,
engine/asyncpg and asyncpg/psycopg, medians of each round's ratio) and prints a table. A
benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import secrets
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any, Generic, LiteralString, Protocol, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit
from uuid import uuid4

import psycopg
from psycopg.types.string import TextLoader

import flowx
from benchmarks.journal_throughput import make_plan, percentile, run_level
from flowx.stores.postgres.commit import COMMIT, COMMIT_BATCH, batch_params, commit_params
from flowx.stores.postgres.creates import CREATE_LEASED_BATCH
from flowx.stores.postgres.creates import batch_params as create_batch_params
from flowx.stores.postgres.leases import RELEASE_MANY
from flowx.stores.postgres.store import CREATE_LEASED, create_params
from flowx.stores.records import InstanceState, NewInstance, Outcome, StepCommit, StepWrite

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_STORE = "postgresql://postgres@127.0.0.1:5432/test"
ARMS = ("psycopg", "asyncpg", "engine")

#: FlowX's batching (commit.GroupCommitter, batching.Batcher, releases.ReleaseBatcher).
MAX_BATCH = 256
MAX_INFLIGHT = 4
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
    """FlowX's group-commit pattern, minimal: a batch per free connection, as many as there
    are connections in flight; what arrives meanwhile waits and goes in the next batch.
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
        self._one, self._many, self._key, self._max_batch = one, many, key, max_batch
        self._pending: deque[tuple[T, asyncio.Future[Any]]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0
        self.items = 0

    async def submit(self, item: T) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        self._dispatch()
        return await future

    def _dispatch(self) -> None:
        while self._pending and self._free:
            batch = self._take()
            task = asyncio.get_running_loop().create_task(self._run(self._free.pop(), batch))
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


# --- schemas and the arms' runs ---------------------------------------------------------------


def with_schema(url: str, schema: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "flowx_schema"]
    query.append(("flowx_schema", schema))
    return urlunsplit(parts._replace(query=urlencode(query)))


def plain(url: str) -> str:
    """The server URL without FlowX's own ``flowx_schema`` parameter."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "flowx_schema"]
    return urlunsplit(parts._replace(query=urlencode(query)))


async def migrate(url: str, schema: str) -> None:
    """A fresh schema, made by FlowX's own migrations."""
    stores = flowx.postgres(with_schema(url, schema))
    await stores.open()
    await stores.close()


async def check(url: str, schema: str, flows: int, steps: int) -> dict[str, Any]:
    """What the run left: every instance Completed with its step rows, every lease ended."""
    async with await psycopg.AsyncConnection.connect(
        plain(url), autocommit=True, options=f"-c search_path={schema}"
    ) as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM flow_instance), "
            "(SELECT count(*) FROM flow_instance WHERE state = 'Completed'), "
            "(SELECT count(*) FROM flow_step), "
            "(SELECT count(*) FROM flow_lease WHERE expires_at <= now())"
        )
        row = await cur.fetchone()
    assert row is not None
    instances, completed, step_rows, released = (int(v) for v in row)
    ok = instances == completed == released == flows and step_rows == flows * steps
    return {
        "instances": instances,
        "completed": completed,
        "step_rows": step_rows,
        "leases_released": released,
        "ok": ok,
    }


async def raw_level(
    driver: Driver, url: str, schema: str, steps: int, instances: int, concurrency: int
) -> dict[str, Any]:
    await migrate(url, schema)
    flows = RawFlows(driver, plain(url), schema, steps)
    await flows.open()
    try:
        await flows.flow(-1)  # warm-up: each lone statement prepared
        if concurrency > 1:  # and the batched ones, on every connection
            await run_flows(flows.flow, concurrency, concurrency)
        warm = 1 + (concurrency if concurrency > 1 else 0)
        flows.latencies.clear()
        for group in (flows.creates, flows.commits, flows.releases):
            group.batches = group.items = 0
        started = time.perf_counter()
        await run_flows(flows.flow, instances, concurrency)
        elapsed = time.perf_counter() - started
    finally:
        await flows.close()
    lat = flows.latencies
    step_commits = instances * steps
    return {
        "concurrency": concurrency,
        "instances": instances,
        "steps_per_instance": steps,
        "elapsed_s": round(elapsed, 3),
        "step_commits": step_commits,
        "step_commits_per_s": round(step_commits / elapsed, 1),
        "flows_per_s": round(instances / elapsed, 1),
        "commit_p50_ms": round(percentile(lat, 0.50) * 1000, 3),
        "commit_p99_ms": round(percentile(lat, 0.99) * 1000, 3),
        "commit_mean_ms": round(statistics.fmean(lat) * 1000, 3) if lat else 0.0,
        "commit_batches": flows.commits.batches,
        "commits_per_batch": round(flows.commits.items / max(1, flows.commits.batches), 2),
        "creates_per_batch": round(flows.creates.items / max(1, flows.creates.batches), 2),
        "releases_per_batch": round(flows.releases.items / max(1, flows.releases.batches), 2),
        "check": await check(url, schema, instances + warm, steps),
    }


async def engine_level(
    url: str, schema: str, steps: int, instances: int, concurrency: int
) -> dict[str, Any]:
    await migrate(url, schema)
    result = await run_level(with_schema(url, schema), make_plan(steps), instances, concurrency)
    result["check"] = await check(url, schema, instances + 1, steps)
    return result


def run_arm(
    arm: str, driver: Driver | None, url: str, schema: str, args: argparse.Namespace, level: int
) -> dict[str, Any]:
    """One arm at one level, in an event loop of its own; an error is recorded, not raised."""
    try:
        if driver is None:
            coro = engine_level(url, schema, args.steps, args.instances, level)
        else:
            coro = raw_level(driver, url, schema, args.steps, args.instances, level)
        return asyncio.run(coro)
    except Exception as exc:
        print(f"  {arm} at {level} failed: {type(exc).__name__}: {exc}")
        return {"concurrency": level, "error": f"{type(exc).__name__}: {exc}"}


# --- the report -------------------------------------------------------------------------------


async def server_info(url: str) -> dict[str, str]:
    info: dict[str, str] = {}
    async with await psycopg.AsyncConnection.connect(plain(url), autocommit=True) as conn:
        for name in ("server_version", "synchronous_commit", "fsync", "commit_delay"):
            row = await (await conn.execute(f"SHOW {name}")).fetchone()
            info[name] = str(row[0]) if row else ""
    return info


async def drop_schemas(url: str, schemas: list[str]) -> None:
    async with await psycopg.AsyncConnection.connect(plain(url), autocommit=True) as conn:
        for schema in schemas:
            await conn.execute(
                psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    psycopg.sql.Identifier(schema)
                )
            )


def version_of(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return round(statistics.median(values), 1) if values else None


def ratio(runs: dict[str, list[dict[str, Any]]], top: str, bottom: str) -> dict[str, Any] | None:
    """``top``/``bottom`` step-commits/s: each round's, and their median."""
    if top not in runs or bottom not in runs:
        return None
    per_round = [
        round(a["step_commits_per_s"] / b["step_commits_per_s"], 3)
        for a, b in zip(runs[top], runs[bottom], strict=True)
        if "step_commits_per_s" in a and "step_commits_per_s" in b
    ]
    if not per_round:
        return None
    return {"median": round(statistics.median(per_round), 3), "rounds": per_round}


def summarise(level: int, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    arms = {
        arm: {
            "step_commits_per_s": median_of(rs, "step_commits_per_s"),
            "flows_per_s": median_of(rs, "flows_per_s"),
            "commit_p50_ms": median_of(rs, "commit_p50_ms"),
            "commit_p99_ms": median_of(rs, "commit_p99_ms"),
            "commits_per_batch": median_of(rs, "commits_per_batch"),
            "runs": rs,
        }
        for arm, rs in runs.items()
    }
    return {
        "concurrency": level,
        "arms": arms,
        "ratios": {
            "engine/psycopg": ratio(runs, "engine", "psycopg"),
            "engine/asyncpg": ratio(runs, "engine", "asyncpg"),
            "asyncpg/psycopg": ratio(runs, "asyncpg", "psycopg"),
        },
    }


def print_table(record: dict[str, Any]) -> None:
    print(
        f"Raw step-commit ceiling on PostgreSQL {record['machine']['server_version']}: "
        f"{record['instances']} instances x {record['steps']} steps, "
        f"{record['rounds']} round(s), medians"
    )
    cols = ["C", "arm", "step_commits/s", "flows/s", "p50_ms", "p99_ms", "per_batch"]
    print("  ".join(f"{c:>14}" for c in cols))
    for level in record["levels"]:
        for arm, s in level["arms"].items():
            cells = [
                level["concurrency"],
                arm,
                s["step_commits_per_s"],
                s["flows_per_s"],
                s["commit_p50_ms"],
                s["commit_p99_ms"],
                s["commits_per_batch"] if s["commits_per_batch"] is not None else "-",
            ]
            print("  ".join(f"{'-' if c is None else c:>14}" for c in cells))
    print("ratios of step-commits/s (median over rounds of each round's ratio):")
    names = ["engine/psycopg", "engine/asyncpg", "asyncpg/psycopg"]
    print("  ".join(f"{c:>16}" for c in ["C", *names]))
    for level in record["levels"]:
        cells = [level["concurrency"]]
        for name in names:
            r = level["ratios"][name]
            cells.append(f"{r['median']:.0%}" if r else "-")
        print("  ".join(f"{c:>16}" for c in cells))
    target = {3: 0.60, 10: 0.75}.get(record["steps"])
    at64 = next((lv for lv in record["levels"] if lv["concurrency"] == 64), None)
    if target and at64 and at64["ratios"]["engine/psycopg"]:
        got = at64["ratios"]["engine/psycopg"]["median"]
        print(
            f"issue 14 target at C=64, {record['steps']} steps: engine >= {target:.0%} of raw "
            f"psycopg; measured {got:.0%}"
        )
    failed = [
        f"{arm}@{lv['concurrency']}"
        for lv in record["levels"]
        for arm, s in lv["arms"].items()
        for r in s["runs"]
        if "error" in r or not r.get("check", {}).get("ok", False)
    ]
    if failed:
        print(f"runs that failed or left the journal wrong: {', '.join(failed)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=DEFAULT_STORE, help="PostgreSQL URL")
    parser.add_argument("--instances", type=int, default=1500)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--arms", default=",".join(ARMS), help="of psycopg,asyncpg,engine")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    args = parser.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    unknown = set(arms) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms: {', '.join(sorted(unknown))}")
    drivers: dict[str, Driver | None] = {}
    for arm in arms:
        if arm == "psycopg":
            drivers[arm] = Psycopg()
        elif arm == "asyncpg":
            try:
                drivers[arm] = Asyncpg()
            except ImportError:
                print("asyncpg is not installed (pip install asyncpg): its arm is skipped")
        else:
            drivers[arm] = None
    levels = [int(c) for c in args.concurrency.split(",")]
    tag = secrets.token_hex(3)
    schemas: list[str] = []
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {
        lv: {a: [] for a in drivers} for lv in levels
    }
    try:
        for rnd in range(args.rounds):
            order = list(drivers) if rnd % 2 == 0 else list(reversed(drivers))
            for level in levels:
                for arm in order:
                    schema = f"ceiling_{tag}_r{rnd}_c{level}_{arm}"
                    schemas.append(schema)
                    result = run_arm(arm, drivers[arm], args.store, schema, args, level)
                    runs[level][arm].append(result)
                    print(
                        f"round {rnd + 1} C={level:<3} {arm:<8} "
                        f"{result.get('step_commits_per_s', 'error')} step-commits/s"
                    )
    finally:
        asyncio.run(drop_schemas(args.store, schemas))
    record = {
        "benchmark": "raw step-commit ceiling (FlowX's commit SQL, group-committed, no engine)",
        "store": "postgresql",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "psycopg": version_of("psycopg"),
            "asyncpg": version_of("asyncpg") if "asyncpg" in drivers else None,
            **asyncio.run(server_info(args.store)),
        },
        "instances": args.instances,
        "steps": args.steps,
        "rounds": args.rounds,
        "arms": list(drivers),
        "batching": {
            "max_batch": MAX_BATCH,
            "batches_in_flight": MAX_INFLIGHT,
            "release_batch": RELEASE_BATCH,
            "release_synchronous_commit": "off",
        },
        "note": (
            "step_commits_per_s = steps x instances / elapsed; the raw arms run FlowX's "
            "CREATE_LEASED(_BATCH), COMMIT(_BATCH) and RELEASE_MANY, imported; engine is "
            "journal_throughput.run_level (B7); ratios are medians of per-round ratios"
        ),
        "levels": [summarise(lv, runs[lv]) for lv in levels],
    }
    out = args.out or RESULTS / f"ceiling-{args.steps}steps.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print_table(record)
    print(f"written to {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out}")


if __name__ == "__main__":
    main()
