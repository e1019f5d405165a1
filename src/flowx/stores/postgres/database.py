"""The connection pool, its session settings and error translation (the open-time schema
check and the migration runner are in ``schema.py``).

Session settings defend against the hazards measured on this machine: a dead worker's
transaction must not hold an instance's row lock for ever (``idle_in_transaction_session_
timeout`` below the lease TTL), a takeover must not queue behind such a lock indefinitely
(``lock_timeout``), and a hung COMMIT must fail in seconds (``tcp_user_timeout``).

Every block of round trips also has a client-side deadline (R9.1): a request the network
acknowledged and then never answered (a pooler that lost its server side, a frozen backend)
trips no TCP timer, so past the deadline the socket is shut down, the pending read ends at
once, the connection is discarded and the caller gets ``JournalNoAnswer`` (a write's outcome
unknown). TCP keepalives on both ends make a partitioned node's server sessions go away in
about a minute instead of hours.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from flowx.redaction import guard_logs, redact
from flowx.stores.errors import (
    JournalNoAnswer,
    JournalUnavailable,
    StoreMisconfigured,
)
from flowx.stores.postgres.denials import denied
from flowx.stores.postgres.schema import MIGRATIONS as MIGRATIONS
from flowx.stores.postgres.schema import SCHEMA_VERSION as SCHEMA_VERSION
from flowx.stores.postgres.schema import apply as apply
from flowx.stores.postgres.schema import check_and_migrate
from flowx.urls import check_schema

#: What a server says at connect time when the configuration, not the network, is wrong.
#: (``no pg_hba.conf entry ..., no encryption``: the URL asked for no TLS where it is required.)
_MISCONFIGURED = re.compile(
    r'(database|role) "[^"]*" does not exist|password authentication failed|'
    r"no pg_hba\.conf entry[^\n]*"
)
#: What libpq or the server says when TLS cannot be set up as the URL asks: a certificate
#: signed by a CA the other side does not trust, a name that does not match, a file that is
#: missing or unreadable, a client certificate the server requires and did not get. Never a
#: network fault (an ``SSL SYSCALL error`` or an EOF mid-handshake is not matched): those are
#: retried as an unavailable journal.
_TLS_MISCONFIGURED = re.compile(
    r"certificate verify failed|alert unknown ca|alert (?:bad|unsupported) certificate|"
    r"alert certificate (?:expired|revoked|unknown|required)|does not match host name|"
    r"root certificate file .* does not exist|certificate present, but not private key|"
    r"could not (?:open|read|load|access) [\w ]*(?:certificate|key|revocation list) file|"
    r"private key file .* (?:has group or world access|must be owned)|"
    r"requires a valid client certificate|certificate authentication failed|"
    r"server does not support SSL|invalid ssl\w* value|could not get server's host name"
)


def misconfigured(dsn: str, exc: BaseException) -> StoreMisconfigured | None:
    """``StoreMisconfigured`` if the server refused the connection for its configuration, or
    TLS could not be set up as the URL asks (the whole of libpq's message is kept then: it
    names the file or the check that failed)."""
    text = " ".join(str(exc).split())
    if _TLS_MISCONFIGURED.search(text):
        detail = text.rsplit(" failed: ", 1)[-1]
        error = StoreMisconfigured(
            f"PostgreSQL at {redact(dsn)}: TLS could not be set up: {detail}. Check sslmode, "
            "sslrootcert (the CA that signed the server's certificate), sslcert and sslkey "
            "in the URL (--db / FLOWX_DATABASE_URL); retrying will not help"
        )
    elif found := _MISCONFIGURED.search(str(exc)):
        error = StoreMisconfigured(
            f"PostgreSQL at {redact(dsn)} refused the connection: {found.group(0)}. Fix the "
            "URL (--db / FLOWX_DATABASE_URL) or create it; retrying will not help"
        )
    else:
        return None
    error.__cause__ = exc
    return error


def unavailable(dsn: str, exc: BaseException) -> JournalUnavailable:
    error = JournalUnavailable(
        f"PostgreSQL at {redact(dsn)} is unavailable ({type(exc).__name__}: "
        f"{redact(' '.join(str(exc).split()), secrets_of=(dsn,), limit=None) or 'no answer'}); "
        "retry when it is back"
    )
    error.__cause__ = exc
    return error


#: The default deadline of a block of round trips; a host lowers it to a third of its lease
#: TTL when that is shorter (``bound_round_trips``).
DEFAULT_ROUND_TRIP_TIMEOUT = 10.0
#: Seconds of silence before TCP keepalive probes start, between probes, and probes lost
#: before the peer is declared dead: a partitioned peer is noticed in about a minute.
_KEEPALIVE = (30, 10, 3)
#: The server polls the client socket of a running query this often (PostgreSQL 14+), so a
#: query whose client vanished is stopped instead of run to its end.
_CHECK_CLIENT_MS = 5_000


def _sever(conn: AsyncConnection[Any]) -> None:
    """Shut the connection's socket down under libpq: a read waiting on it ends at once (EOF),
    libpq marks the connection bad, and the pool discards it. Closing the fd instead would
    leave the reader waiting on a descriptor the event loop no longer watches."""
    with contextlib.suppress(Exception):
        dup = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            dup.shutdown(socket.SHUT_RDWR)
        finally:
            dup.close()


@contextlib.asynccontextmanager
async def deadline(
    conn: AsyncConnection[Any], seconds: float | None, where: str
) -> AsyncIterator[None]:
    """Bound the round trips made on ``conn`` inside the block (R9.1).

    Past ``seconds`` the socket is severed; any psycopg error the block then raises leaves as
    ``JournalNoAnswer``. No task is cancelled: psycopg answers a cancellation by asking the
    server to cancel and waiting again, which is exactly what a silent peer never answers.
    """
    if seconds is None:
        yield
        return
    severed = False

    def sever() -> None:
        nonlocal severed
        severed = True
        _sever(conn)

    handle = asyncio.get_running_loop().call_later(seconds, sever)
    try:
        yield
    except psycopg.Error as exc:
        if severed:
            raise JournalNoAnswer(
                f"{where} gave no answer within {seconds:g}s; the connection was discarded "
                "and what it was doing has an unknown outcome (a write is re-read before "
                "anything re-runs)"
            ) from exc
        raise
    finally:
        handle.cancel()
    if severed:
        # Every round trip was answered, the last just as the deadline fell: the work is
        # done, but the socket is gone; close it so the pool does not hand it out again.
        await conn.close()


@dataclass(frozen=True, kw_only=True, slots=True)
class SessionLimits:
    """How long one connection may wait for the server, and the server for it.

    Every session of the pool gets them as server options, so a lock held too long, an idle
    transaction left open, or a peer that vanished fails a round trip instead of stalling
    the node (R9.1); grouped so the database's constructor stays small.
    """

    connect_timeout: float = 5.0
    statement_timeout_ms: int = 30_000
    lock_timeout_ms: int = 5_000
    idle_in_transaction_timeout_ms: int = 10_000
    tcp_user_timeout_ms: int = 10_000


class PostgresDatabase:
    """A psycopg async pool bound to one FlowX schema."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "flowx",
        min_size: int = 1,
        max_size: int = 16,
        limits: SessionLimits | None = None,
    ) -> None:
        check_schema(schema, dsn)
        self.dsn = dsn
        self._where: tuple[str, str] | None = None
        #: The login the pool's connections use (for a refused privilege's message), by URL.
        self._login: tuple[str, str] | None = None
        self.schema = schema
        limits = limits or SessionLimits()
        connect_timeout = limits.connect_timeout
        self._connect_timeout = connect_timeout
        idle, interval, count = _KEEPALIVE
        options = (
            f"-c search_path={schema} -c TimeZone=UTC "
            f"-c statement_timeout={limits.statement_timeout_ms} "
            f"-c lock_timeout={limits.lock_timeout_ms} "
            f"-c idle_in_transaction_session_timeout={limits.idle_in_transaction_timeout_ms} "
            f"-c tcp_keepalives_idle={idle} -c tcp_keepalives_interval={interval} "
            f"-c tcp_keepalives_count={count}"
        )
        self._kwargs: dict[str, Any] = {
            "autocommit": True,
            "options": options,
            "connect_timeout": max(1, int(connect_timeout)),
            "tcp_user_timeout": limits.tcp_user_timeout_ms,
            "keepalives": 1,
            "keepalives_idle": idle,
            "keepalives_interval": interval,
            "keepalives_count": count,
            "application_name": "flowx",
        }
        #: The deadline of every block of round trips (R9.1); ``None`` turns it off.
        self.round_trip_timeout: float | None = DEFAULT_ROUND_TRIP_TIMEOUT
        self._min_size, self._max_size = min_size, max_size
        self.pool = self._new_pool()
        #: A psycopg pool opens once: after a failed open (or a close) the next ``open()``
        #: needs a fresh one, or a journal that was down at boot could never be reconnected.
        self._pool_spent = False

    def _new_pool(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        return AsyncConnectionPool(
            self.dsn,
            min_size=self._min_size,
            max_size=self._max_size,
            kwargs=self._kwargs,
            configure=self._configure,
            timeout=self._connect_timeout,
            open=False,
            name="flowx",
        )

    @staticmethod
    async def _configure(conn: AsyncConnection[Any]) -> None:
        # Payloads come back as the exact text stored (R2.1), ids as strings.
        conn.adapters.register_loader("json", TextLoader)
        conn.adapters.register_loader("uuid", TextLoader)
        if conn.info.server_version >= 140000:
            await conn.execute(
                "SELECT set_config('client_connection_check_interval', %s, false)",
                (str(_CHECK_CLIENT_MS),),
            )

    async def connect(self) -> AsyncConnection[Any]:
        """A connection of its own, outside the pool, configured like the pool's. Connecting
        is bounded by the connect timeout, configuring by the round-trip deadline (R9.1)."""
        conn = await AsyncConnection.connect(self.dsn, **self._kwargs)
        try:
            async with deadline(conn, self.round_trip_timeout, self.where()):
                await self._configure(conn)
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.close()
            raise
        return conn

    def where(self) -> str:
        where = self._where
        if where is None or where[0] != self.dsn:  # asked on every checkout: kept
            where = self._where = (self.dsn, f"PostgreSQL at {redact(self.dsn)}")
        return where[1]

    @contextlib.asynccontextmanager
    async def connection(self, *, bounded: bool = True) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection; driver and pool errors leave as ``JournalUnavailable``.

        The block is bounded by ``round_trip_timeout`` unless ``bounded`` is off (migrations,
        and an outbox claim, which the server bounds with its idle-in-transaction timeout)."""
        limit = self.round_trip_timeout if bounded else None
        try:
            async with self.pool.connection() as conn, deadline(conn, limit, self.where()):
                if self._login is None or self._login[0] != self.dsn:  # read once per URL
                    self._login = (self.dsn, conn.info.user)
                yield conn
        except psycopg.errors.InsufficientPrivilege as exc:
            login = self._login[1] if self._login is not None else None
            raise denied(exc, login=login, schema=self.schema, where=self.where()) from exc
        except (psycopg.OperationalError, PoolTimeout, psycopg.errors.AdminShutdown) as exc:
            raise unavailable(self.dsn, exc) from exc
        except psycopg.errors.QueryCanceled as exc:
            raise unavailable(self.dsn, exc) from exc
        except psycopg.errors.LockNotAvailable as exc:
            raise unavailable(self.dsn, exc) from exc

    async def open(self, *, migrate: bool = True) -> None:
        if self._pool_spent:
            await self.pool.close()
            self.pool = self._new_pool()
        self._pool_spent = True
        guard_logs("psycopg", "flowx")  # R9.8: a driver's line never shows the DSN's secrets
        try:
            await self._fill()
        except (PoolTimeout, psycopg.OperationalError) as exc:
            await self.pool.close()
            reason = await self._why_not(exc)
            raise misconfigured(self.dsn, reason) or unavailable(self.dsn, reason) from exc
        except BaseException:
            await self.pool.close()
            raise
        try:
            await self._check_and_migrate(migrate)
        except BaseException:
            await self.pool.close()
            raise

    async def _fill(self) -> None:
        """Open the pool and, alongside, try one connection of its own. The pool retries a
        refused connection until its timeout and then says only that it timed out; the lone
        attempt hears the refusal at once. One the configuration causes (a server
        certificate signed by another CA, a database that does not exist) fails the open
        there and then, as ``StoreMisconfigured``; any other failure is left to the pool."""
        filling = asyncio.ensure_future(self.pool.open(wait=True, timeout=self._connect_timeout))
        asking = asyncio.ensure_future(self._refusal())
        try:
            await asyncio.wait((filling, asking), return_when=asyncio.FIRST_COMPLETED)
            if asking.done() and (refusal := asking.result()) is not None:
                raise refusal
            await filling
        finally:
            for task in (filling, asking):
                task.cancel()
            await asyncio.gather(filling, asking, return_exceptions=True)

    async def _refusal(self) -> StoreMisconfigured | None:
        """The configuration error one direct connection attempt meets, if any."""
        try:
            async with asyncio.timeout(self._connect_timeout):
                conn = await psycopg.AsyncConnection.connect(self.dsn, **self._kwargs)
        except (psycopg.Error, TimeoutError, OSError) as exc:
            return misconfigured(self.dsn, exc)
        await conn.close()
        return None

    async def _why_not(self, exc: BaseException) -> BaseException:
        """Why the pool could not fill: its ``PoolTimeout`` hides the server's answer
        (``database "x" does not exist``, a failed password), so ask once directly. A server
        that answers does so at once; one that does not (a black hole) costs a quarter of the
        connect timeout at most, so a node booting on a dead network is not held up."""
        if not isinstance(exc, PoolTimeout):
            return exc
        try:
            async with asyncio.timeout(min(1.0, self._connect_timeout / 4)):
                conn = await psycopg.AsyncConnection.connect(self.dsn, **self._kwargs)
        except (psycopg.Error, TimeoutError, OSError) as reason:
            return reason
        await conn.close()
        return exc

    async def _check_and_migrate(self, migrate: bool) -> None:
        # Unbounded: a migration may take long; the session's timeouts still bound it.
        async with self.connection(bounded=False) as conn:
            await check_and_migrate(conn, self.schema, redact(self.dsn), migrate=migrate)

    async def schema_version(self) -> int:
        async with self.connection() as conn:
            row = await (
                await conn.execute("SELECT coalesce(max(version), 0) FROM flowx_schema_migrations")
            ).fetchone()
            return int(row[0]) if row else 0

    async def server_time(self) -> datetime:
        """The server's clock now (``clock_timestamp()``), to measure this node's offset."""
        async with self.connection() as conn:
            row = await (await conn.execute("SELECT clock_timestamp()")).fetchone()
        assert row is not None  # nosec B101  # invariant: SELECT answers one row
        moment: datetime = row[0]
        return moment

    async def close(self) -> None:
        await self.pool.close()


class DedicatedConnection:
    """One connection kept apart from the pool for one job (lease renewals, a committer),
    reconnected after any failure, with the same deadline and error translation as the pool's.

    ``check_after``: a connection idle for longer is probed (one ``SELECT 1``) before it is
    used, and replaced if the probe fails. A write must not be the first to find that an
    outage killed the connection while it sat idle: its outcome would then be unknown."""

    def __init__(
        self,
        db: PostgresDatabase,
        job: str,
        *,
        asynchronous: bool = False,
        check_after: float | None = None,
    ) -> None:
        self._db = db
        self._job = job
        self._asynchronous = asynchronous
        self._check_after = check_after
        self._used = 0.0
        self._conn: AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()

    async def _probe(self, conn: AsyncConnection[Any]) -> bool:
        try:
            async with deadline(conn, self._db.round_trip_timeout, self._db.where()):
                await conn.execute("SELECT 1")
        except Exception:
            await self._discard()
            return False
        return True

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        async with self._lock:
            try:
                idle = time.monotonic() - self._used
                if (
                    self._conn is not None
                    and self._check_after is not None
                    and idle > self._check_after
                ):
                    await self._probe(self._conn)
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = await self._db.connect()
                    if self._asynchronous:
                        await self._conn.execute("SET synchronous_commit = off")
                conn = self._conn
                self._used = time.monotonic()
                async with deadline(conn, self._db.round_trip_timeout, self._db.where()):
                    yield conn
            except psycopg.errors.InsufficientPrivilege as exc:
                # The connection is sound; the role lacks a grant. Said plainly, not retried.
                login = self._conn.info.user if self._conn is not None else None
                await self._discard()
                raise denied(
                    exc,
                    login=login,
                    schema=self._db.schema,
                    where=self._db.where(),
                    job=self._job,
                ) from exc
            except BaseException as exc:
                await self._discard()
                if isinstance(exc, psycopg.OperationalError | psycopg.errors.QueryCanceled):
                    raise unavailable(self._db.dsn, exc) from exc
                raise

    async def warm(self) -> None:
        """Connect now rather than at first use (a store that opens is ready to commit)."""
        async with self.connection():
            pass

    async def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def close(self) -> None:
        async with self._lock:
            await self._discard()
