"""What opening a store checks, and the migration runner: no DDL unless the schema needs it.

Opening first reads the catalog and the recorded schema version with plain SELECTs, under no
lock. A current schema is the common case and ends there: no ``CREATE SCHEMA``, no advisory
lock, nothing a role that may only read and write rows is refused (R9.8). Only a schema that
is missing or older than this FlowX goes on to the migration path — and only when the store
may migrate; otherwise the answer is ``JournalNotFound`` or ``SchemaNotMigrated``, naming
``flowx migrate``.

The migration path serialises migrators with an advisory lock and looks again under it (a
peer may have just migrated). When the schema is owned by a role this login is a member of
(``flowx migrate --roles`` makes ``<prefix>_owner`` its owner), the DDL runs as that role, so
new tables belong to it, and the group roles' grants are renewed in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from psycopg import AsyncConnection, sql

from flowx.errors import JournalNotFound
from flowx.stores import migrations
from flowx.stores.errors import NotAFlowXStore, SchemaNotMigrated, SchemaTooNew
from flowx.stores.postgres.roles import regrant, role_prefix_of

MIGRATIONS = migrations.load("flowx.stores.postgres")
SCHEMA_VERSION = MIGRATIONS[-1].version
#: Serialises migrators across processes (pg_advisory_xact_lock key: "FLWX").
MIGRATION_LOCK: Final = 0x464C5758
#: A migration may build an index over a large journal: the session's 30 s statement limit
#: is lifted to this for the migration's own transaction. Its lock wait stays short (the
#: session's ``lock_timeout``): DDL queued for a lock would block every worker behind it.
MIGRATION_STATEMENT_TIMEOUT: Final = "1h"

_BOOKKEEPING: Final = "flowx_schema_migrations"

# The catalog, readable by every role: does the schema exist, does it hold the bookkeeping
# table, and a few of the tables it holds (for the message when it is not FlowX's).
_PROBE: Final = (
    "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(s)s), "
    "EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %(s)s AND c.relname = %(t)s AND c.relkind IN ('r', 'p')), "
    "ARRAY(SELECT c.relname::text FROM pg_class c JOIN pg_namespace n "
    "ON n.oid = c.relnamespace WHERE n.nspname = %(s)s AND c.relkind IN ('r', 'p') "
    "ORDER BY 1 LIMIT 6)"
)


@dataclass(frozen=True, slots=True)
class Found:
    """What the catalog says about the schema."""

    schema_exists: bool
    journal: bool
    tables: tuple[str, ...]


async def probe(conn: AsyncConnection[Any], schema: str) -> Found:
    row = await (await conn.execute(_PROBE.encode(), {"s": schema, "t": _BOOKKEEPING})).fetchone()
    assert row is not None  # nosec B101  # invariant: an aggregate SELECT returns one row
    return Found(schema_exists=bool(row[0]), journal=bool(row[1]), tables=tuple(row[2]))


async def recorded_version(conn: AsyncConnection[Any], schema: str) -> int:
    query = sql.SQL("SELECT coalesce(max(version), 0) FROM {}.{}").format(
        sql.Identifier(schema), sql.Identifier(_BOOKKEEPING)
    )
    row = await (await conn.execute(query)).fetchone()
    return int(row[0]) if row else 0


def _check(found: Found, version: int | None, *, migrate: bool, schema: str, where: str) -> bool:
    """Raise for a schema this FlowX may not use as it is; ``True`` when it must migrate."""
    if found.tables and not found.journal:
        raise NotAFlowXStore(
            f"schema {schema!r} at {where} holds tables ({', '.join(found.tables[:5])}…) but no "
            "FlowX journal; nothing was changed. Use another schema (schema=...) or database"
        )
    if not found.journal:
        if not migrate:
            raise JournalNotFound(
                f"no FlowX journal in schema {schema!r} at {where}; nothing was created. Check "
                "--db (and its flowx_schema), or create the journal with `flowx migrate --db ...`"
            )
        return True
    assert version is not None  # nosec B101  # invariant: a journal has a recorded version
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(f"schema {schema!r} at {where}", version, SCHEMA_VERSION)
    if version < SCHEMA_VERSION and not migrate:
        raise SchemaNotMigrated(
            f"schema {schema!r} at {where} is at schema {version}, this FlowX needs "
            f"{SCHEMA_VERSION}; run `flowx migrate --db ...` (as the schema's owner)"
        )
    return version < SCHEMA_VERSION


async def check_and_migrate(
    conn: AsyncConnection[Any], schema: str, where: str, *, migrate: bool
) -> None:
    """Open-time check on an autocommit connection; migrates only when it must and may."""
    found = await probe(conn, schema)
    version = await recorded_version(conn, schema) if found.journal else None
    if not _check(found, version, migrate=migrate, schema=schema, where=where):
        return
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        await migrate_locked(conn, schema, where)


async def migrate_locked(conn: AsyncConnection[Any], schema: str, where: str) -> None:
    """Bring the schema to ``SCHEMA_VERSION`` inside the caller's transaction, which holds
    ``MIGRATION_LOCK``. Looks again first: a peer may have migrated while this one waited."""
    found = await probe(conn, schema)
    version = await recorded_version(conn, schema) if found.journal else None
    if not _check(found, version, migrate=True, schema=schema, where=where):
        return
    await conn.execute(
        sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(MIGRATION_STATEMENT_TIMEOUT))
    )
    if not found.schema_exists:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    prefix = await role_prefix_of(conn, schema)
    await _act_as_owner(conn, schema)
    if not found.journal:
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {}.{} (version integer PRIMARY KEY, "
                "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(sql.Identifier(schema), sql.Identifier(_BOOKKEEPING))
        )
    for migration in MIGRATIONS[version or 0 :]:
        await apply(conn, migration)
    if prefix is not None:
        await regrant(conn, schema, prefix)


async def _act_as_owner(conn: AsyncConnection[Any], schema: str) -> None:
    """Run the DDL as the schema's owner when this login may (a member of it, or a
    superuser): what it creates then belongs to the owner role, like the rest."""
    row = await (
        await conn.execute(
            "SELECT r.rolname, r.rolname <> current_user AND pg_has_role(current_user, r.oid, "
            "'MEMBER') FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner "
            "WHERE n.nspname = %s",
            (schema,),
        )
    ).fetchone()
    if row is not None and row[1]:
        await conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(row[0])))


async def apply(conn: AsyncConnection[Any], migration: migrations.Migration) -> None:
    """Run one migration file and record it, inside the caller's transaction."""
    await conn.execute(migration.sql.encode())
    await conn.execute(
        "INSERT INTO flowx_schema_migrations (version, name) VALUES (%s, %s)",
        (migration.version, migration.name),
    )
