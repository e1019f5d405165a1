"""The connection pool, its session settings, error translation and the migration runner.

Session settings defend against the hazards measured on this machine: a dead worker's
transaction must not hold an instance's row lock for ever (``idle_in_transaction_session_
timeout`` below the lease TTL), a takeover must not queue behind such a lock indefinitely
(``lock_timeout``), and a hung COMMIT must fail in seconds (``tcp_user_timeout``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from flowx.stores import migrations
from flowx.stores.errors import (
    JournalUnavailable,
    NotAFlowXStore,
    SchemaNotMigrated,
    SchemaTooNew,
)

MIGRATIONS = migrations.load("flowx.stores.postgres")
SCHEMA_VERSION = MIGRATIONS[-1].version
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: Serialises migrators across processes (pg_advisory_xact_lock key: "FLWX").
_MIGRATION_LOCK = 0x464C5758


def redact(dsn: str) -> str:
    """A DSN fit for a log line: no password."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", dsn)


def unavailable(dsn: str, exc: BaseException) -> JournalUnavailable:
    error = JournalUnavailable(
        f"PostgreSQL at {redact(dsn)} is unavailable ({type(exc).__name__}: "
        f"{str(exc).strip() or 'no answer'}); retry when it is back"
    )
    error.__cause__ = exc
    return error


class PostgresDatabase:
    """A psycopg async pool bound to one FlowX schema."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "flowx",
        min_size: int = 1,
        max_size: int = 16,
        connect_timeout: float = 5.0,
        statement_timeout_ms: int = 30_000,
        lock_timeout_ms: int = 5_000,
        idle_in_transaction_timeout_ms: int = 10_000,
        tcp_user_timeout_ms: int = 10_000,
    ) -> None:
        if not _SCHEMA_NAME.match(schema):
            raise ValueError(f"schema name {schema!r} must be a lower-case SQL identifier")
        self.dsn = dsn
        self.schema = schema
        self._connect_timeout = connect_timeout
        options = (
            f"-c search_path={schema} -c TimeZone=UTC "
            f"-c statement_timeout={statement_timeout_ms} -c lock_timeout={lock_timeout_ms} "
            f"-c idle_in_transaction_session_timeout={idle_in_transaction_timeout_ms}"
        )
        self._kwargs: dict[str, Any] = {
            "autocommit": True,
            "options": options,
            "connect_timeout": max(1, int(connect_timeout)),
            "tcp_user_timeout": tcp_user_timeout_ms,
            "application_name": "flowx",
        }
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

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection; driver and pool errors leave as ``JournalUnavailable``."""
        try:
            async with self.pool.connection() as conn:
                yield conn
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
        try:
            await self.pool.open(wait=True, timeout=self._connect_timeout)
        except (PoolTimeout, psycopg.OperationalError) as exc:
            await self.pool.close()
            raise unavailable(self.dsn, exc) from exc
        try:
            await self._check_and_migrate(migrate)
        except BaseException:
            await self.pool.close()
            raise

    async def _check_and_migrate(self, migrate: bool) -> None:
        async with self.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            await conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
            )
            tables = {
                r[0]
                for r in await (
                    await conn.execute(
                        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                        (self.schema,),
                    )
                ).fetchall()
            }
            if tables and "flowx_schema_migrations" not in tables:
                raise NotAFlowXStore(
                    f"schema {self.schema!r} at {redact(self.dsn)} holds tables "
                    f"({', '.join(sorted(tables)[:5])}…) but no FlowX journal; nothing was "
                    "changed. Use another schema (schema=...) or database"
                )
            if not tables:
                await conn.execute(
                    "CREATE TABLE flowx_schema_migrations (version integer PRIMARY KEY, "
                    "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
                )
            row = await (
                await conn.execute("SELECT coalesce(max(version), 0) FROM flowx_schema_migrations")
            ).fetchone()
            current = int(row[0]) if row else 0
            where = f"schema {self.schema!r} at {redact(self.dsn)}"
            if current > SCHEMA_VERSION:
                raise SchemaTooNew(where, current, SCHEMA_VERSION)
            if current < SCHEMA_VERSION and not migrate:
                raise SchemaNotMigrated(
                    f"{where} is at schema {current}, this FlowX needs {SCHEMA_VERSION}; "
                    "run `flowx migrate --db ...`"
                )
            for migration in MIGRATIONS[current:]:
                await apply(conn, migration)

    async def schema_version(self) -> int:
        async with self.connection() as conn:
            row = await (
                await conn.execute("SELECT coalesce(max(version), 0) FROM flowx_schema_migrations")
            ).fetchone()
            return int(row[0]) if row else 0

    async def close(self) -> None:
        await self.pool.close()


async def apply(conn: AsyncConnection[Any], migration: migrations.Migration) -> None:
    """Run one migration file and record it, inside the caller's transaction."""
    await conn.execute(migration.sql.encode())
    await conn.execute(
        "INSERT INTO flowx_schema_migrations (version, name) VALUES (%s, %s)",
        (migration.version, migration.name),
    )
