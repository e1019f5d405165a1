"""The ``engine-asyncpg`` arm of ``benchmarks.ceiling``: the real engine, its hot-path writes
sent through asyncpg instead of psycopg.

Issue 14 item 4 asks whether asyncpg under the ENGINE (not just under the raw SQL) is worth a
switch: only a measured win of at least 1.3x would be. This module makes a ``PostgresStores``
whose three batched hot-path writes go through asyncpg and everything else through psycopg
as in production:

- the group-created starts: ``GroupCreator`` itself, its ``_one`` being
  ``PostgresJournal.create_one`` (``CREATE_LEASED``) and its ``_many``
  ``CREATE_LEASED_BATCH``, both unchanged, each on a connection taken from ``Lanes``;
- the group step commits: ``GroupCommitter``'s own ``_one`` / ``_many`` (``COMMIT``,
  ``COMMIT_BATCH``), whose connection slot (``_slot``) hands out a lane instead of a psycopg
  ``DedicatedConnection``;
- the batched lease releases: ``ReleaseBatcher`` sending ``RELEASE_MANY`` on one lane with
  ``synchronous_commit = off`` (as the lease store's own connection has).

So the SQL text, the parameter builders and the outcome handling (``outcome_of``, the
``FencedOut`` / ``UnknownInstance`` mapping of a batch's rows, the existing row of a start
that conflicted) are FlowX's own code, run as is: what changes is the connection under it.
``AsyncpgConn`` is that connection: the slice of psycopg's ``AsyncConnection`` the code above
calls (``execute``, ``cursor(row_factory=dict_row)``, ``fetchone`` / ``fetchall``), over
asyncpg. The ``%(name)s`` / ``%(name)b`` placeholders become ``$n`` by ``ceiling_arms.
to_dollar`` (a positional ``%s`` by its position); asyncpg prepares and caches every
statement on each connection. Rows come back as psycopg's do under FlowX's loaders (uuid and
json as text). A server error becomes the psycopg error of its SQLSTATE, constraint name
kept, so ``send_one``'s duplicate-step check and ``Batcher``'s fallback to single writes read
it unchanged; a lost connection becomes ``JournalUnavailable`` and the lane reconnects.

Lanes are opened when the store opens and held: one per batch in flight (4 for commits, 4 for
starts, as ``GroupCommitter`` and ``Batcher`` allow) and one for releases, with the session
settings of FlowX's pool (search path, UTC, its timeouts). Each statement has the pool's
round-trip deadline as asyncpg's own ``timeout``.

What this arm does not do as production does: a lane idle for over a second is not probed
before use (``DedicatedConnection``'s ``check_after``), and the deadline bounds each
statement rather than the block. asyncpg is a measured-only dependency, imported when a
store is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Any, LiteralString

import psycopg
from psycopg.pq import DiagnosticField

from benchmarks.ceiling_arms import to_dollar
from flowx.stores.postgres import PostgresStores
from flowx.stores.postgres.commit import GroupCommitter
from flowx.stores.postgres.database import PostgresDatabase, unavailable
from flowx.stores.postgres.leases import RELEASE_MANY, PostgresLeaseStore, release_params
from flowx.stores.postgres.notify import Notifier
from flowx.stores.postgres.store import PostgresJournal
from flowx.stores.records import Lease

#: Batches in flight: ``GroupCommitter``'s and ``Batcher``'s defaults.
LANES = 4
_POSITIONAL = re.compile(r"%s|%%")
#: A server error's fields that FlowX's code reads from a psycopg error's ``diag``.
_DIAG = {
    DiagnosticField.SQLSTATE: "sqlstate",
    DiagnosticField.MESSAGE_PRIMARY: "message",
    DiagnosticField.CONSTRAINT_NAME: "constraint_name",
    DiagnosticField.TABLE_NAME: "table_name",
    DiagnosticField.SCHEMA_NAME: "schema_name",
}


def positional(query: str) -> tuple[str, None]:
    """``query`` with its positional ``%s`` placeholders as ``$1``, ``$2``, ..."""
    count = 0

    def sub(m: re.Match[str]) -> str:
        nonlocal count
        if m.group(0) == "%%":
            return "%"
        count += 1
        return f"${count}"

    return _POSITIONAL.sub(sub, query), None


def as_psycopg(exc: Exception) -> Exception:
    """The psycopg error of a server error's SQLSTATE (its constraint name kept, for
    ``send_one``); any other error as it is."""
    state = getattr(exc, "sqlstate", None)
    if not isinstance(state, str):
        return exc
    info: dict[int, bytes | None] = {
        int(field): str(value).encode()
        for field, name in _DIAG.items()
        if (value := getattr(exc, name, None)) is not None
    }
    error = psycopg.errors.lookup(state)(str(exc), info=info)
    error.__cause__ = exc
    return error


def _text(value: Any) -> Any:
    # FlowX's pool loads uuid as text (database._configure); asyncpg gives json as text too.
    return str(value) if isinstance(value, uuid.UUID) else value


class AsyncpgCursor:
    """A psycopg cursor's ``execute`` / ``fetchone`` / ``fetchall``, over asyncpg."""

    def __init__(self, conn: AsyncpgConn, *, dicts: bool) -> None:
        self._conn, self._dicts = conn, dicts
        self._rows: list[Any] = []

    async def execute(
        self,
        query: LiteralString,
        params: Mapping[str, Any] | Sequence[Any] | None = None,
        *,
        prepare: bool | None = None,
    ) -> AsyncpgCursor:
        records = await self._conn.fetch(query, params)
        if self._dicts:
            self._rows = [{k: _text(v) for k, v in r.items()} for r in records]
        else:
            self._rows = [tuple(_text(v) for v in r.values()) for r in records]
        return self

    async def fetchone(self) -> Any:
        return self._rows.pop(0) if self._rows else None

    async def fetchall(self) -> list[Any]:
        rows, self._rows = self._rows, []
        return rows


class AsyncpgConn:
    """The slice of psycopg's ``AsyncConnection`` FlowX's batched writes call, over one
    asyncpg connection; every statement prepared (asyncpg's statement cache)."""

    def __init__(self, raw: Any, timeout: float | None) -> None:
        self.raw, self._timeout = raw, timeout
        self._translated: dict[str, tuple[str, tuple[str, ...] | None]] = {}

    def cursor(self, row_factory: Any = None) -> AsyncpgCursor:
        return AsyncpgCursor(self, dicts=row_factory is not None)

    async def execute(
        self,
        query: LiteralString,
        params: Mapping[str, Any] | Sequence[Any] | None = None,
        *,
        prepare: bool | None = None,
    ) -> AsyncpgCursor:
        return await self.cursor().execute(query, params)

    async def fetch(self, query: str, params: Mapping[str, Any] | Sequence[Any] | None) -> Any:
        translated = self._translated.get(query)
        if translated is None:
            named = isinstance(params, Mapping)
            translated = to_dollar(query) if named else positional(query)
            self._translated[query] = translated
        text, names = translated
        if names is None:
            args: Sequence[Any] = params if isinstance(params, Sequence) else ()
        else:
            assert isinstance(params, Mapping)  # nosec B101  # named placeholders, a mapping
            args = [params[n] for n in names]
        try:
            return await self.raw.fetch(text, *args, timeout=self._timeout)
        except Exception as exc:
            raise as_psycopg(exc) from exc


class Lanes:
    """``count`` asyncpg connections opened once and held, one per batch in flight, with the
    session settings of FlowX's pool. ``connection()`` is a ``PostgresDatabase.connection``
    for ``GroupCreator`` and ``PostgresJournal.create_one``: a free lane, not a pooled one."""

    def __init__(self, db: PostgresDatabase, count: int, *, asynchronous: bool = False) -> None:
        self._db, self._count, self._asynchronous = db, count, asynchronous
        self._free: list[AsyncpgConn] = []
        self._all: list[AsyncpgConn] = []

    def _settings(self) -> dict[str, str]:
        # The pool's own ``-c name=value`` options (search path, UTC, timeouts, keepalives).
        options: str = self._db._kwargs["options"]
        pairs = (o.split("=", 1) for o in options.removeprefix("-c ").split(" -c "))
        settings = {k.strip(): v.strip() for k, v in pairs}
        settings["application_name"] = "flowx"
        if self._asynchronous:
            settings["synchronous_commit"] = "off"
        return settings

    async def _connect(self) -> AsyncpgConn:
        import asyncpg  # type: ignore[import-untyped,unused-ignore]

        raw = await asyncpg.connect(self._db.dsn, server_settings=self._settings())
        return AsyncpgConn(raw, self._db.round_trip_timeout)

    async def open(self) -> None:
        if not self._all:
            self._all = list(await asyncio.gather(*(self._connect() for _ in range(self._count))))
            self._free = list(self._all)

    async def close(self) -> None:
        conns, self._all, self._free = self._all, [], []
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.raw.close()

    @contextlib.asynccontextmanager
    async def connection(self, *, bounded: bool = True) -> AsyncIterator[AsyncpgConn]:
        # At most ``count`` batches run at a time, each one write at a time: one is free.
        conn = self._free.pop()
        try:
            if conn.raw.is_closed():
                fresh = await self._connect()  # a failure leaves the closed one in its place
                self._all[self._all.index(conn)] = fresh
                conn = fresh
            yield conn
        except (OSError, psycopg.OperationalError) as exc:
            raise unavailable(self._db.dsn, exc) from exc
        except Exception as exc:
            if type(exc).__module__.startswith("asyncpg"):  # the connection, not the data
                raise unavailable(self._db.dsn, exc) from exc
            raise
        finally:
            self._free.append(conn)


class LaneCommitter(GroupCommitter):
    """``GroupCommitter`` as it is (``_one``, ``_many``, the batcher), its slots lanes."""

    def __init__(self, db: PostgresDatabase, lanes: Lanes) -> None:
        super().__init__(db, max_inflight=LANES)
        self._lanes = lanes

    async def warm(self) -> None:
        await self._lanes.open()

    async def close(self) -> None:
        await self._lanes.close()

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[Any]:
        async with self._lanes.connection() as conn:
            yield conn


class AsyncpgJournal(PostgresJournal):
    """``PostgresJournal`` with its starts and step commits on asyncpg lanes; its reads, its
    opens and every other write on psycopg."""

    def __init__(
        self, db: PostgresDatabase, notifier: Notifier | None, work: Notifier | None
    ) -> None:
        super().__init__(db, notifier, work)
        self._group = LaneCommitter(db, Lanes(db, LANES))
        self._create_lanes = Lanes(db, LANES)
        # A journal of its own over the start lanes: its GroupCreator and create_one are
        # FlowX's, their ``db.connection()`` a lane.
        starts = PostgresJournal(self._create_lanes)  # type: ignore[arg-type]
        self._creates = starts._creates

    async def warm(self) -> None:
        await asyncio.gather(super().warm(), self._create_lanes.open())

    async def close(self) -> None:
        await super().close()
        await self._create_lanes.close()


class AsyncpgLeaseStore(PostgresLeaseStore):
    """``PostgresLeaseStore`` with its batched releases on one asyncpg lane
    (``synchronous_commit = off``); acquisitions and renewals on psycopg."""

    def __init__(self, db: PostgresDatabase, work: Notifier | None) -> None:
        super().__init__(db, work)
        self.release_lane = Lanes(db, 1, asynchronous=True)

    async def _release_many(self, batch: Sequence[tuple[Lease, datetime | None]]) -> None:
        # As PostgresLeaseStore._release_many, on the lane.
        async with self.release_lane.connection() as conn:
            query = await conn.execute(RELEASE_MANY, release_params(batch), prepare=True)
            rows = await query.fetchall()
        if self._work is not None and any(row[0] for row in rows):
            self._work.mark()

    async def close(self) -> None:
        await super().close()
        await self.release_lane.close()


class AsyncpgStores(PostgresStores):
    """``PostgresStores`` whose hot-path writes (starts, step commits, releases) go through
    asyncpg; built like ``flowx.postgres`` from a server URL and a schema."""

    def __init__(self, dsn: str, *, schema: str = "flowx", **pool: Any) -> None:
        super().__init__(dsn, schema=schema, **pool)
        self.journal = AsyncpgJournal(self.db, self.notifier, self.work_notifier)
        self.leases = AsyncpgLeaseStore(self.db, self.work_notifier)

    async def open(self) -> None:
        await super().open()
        assert isinstance(self.leases, AsyncpgLeaseStore)  # nosec B101  # set above
        await self.leases.release_lane.open()


def available() -> bool:
    """Whether asyncpg is installed (the arm is skipped otherwise)."""
    try:
        import asyncpg  # type: ignore[import-untyped,unused-ignore]  # noqa: F401
    except ImportError:
        return False
    return True
