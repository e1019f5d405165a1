"""Helpers shared by the PostgreSQL schema, migration and query-plan tests."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
from psycopg import sql

from flowx.stores.postgres import PostgresStores
from tests.postgres_support import PG_DSN

__all__ = [
    "MIGRATIONS_TABLE_DDL",
    "PG_DSN",
    "aconnect",
    "columns",
    "connect",
    "create_schema",
    "drop_schema",
    "index_names",
    "new_schema_name",
    "node_types",
    "open_stores",
    "plan_nodes",
]

#: The bookkeeping table exactly as ``flowx.stores.postgres.database`` creates it.
MIGRATIONS_TABLE_DDL = (
    "CREATE TABLE flowx_schema_migrations (version integer PRIMARY KEY, "
    "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
)


def new_schema_name(prefix: str = "flowx_t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def _options(schema: str) -> str:
    return f"-c search_path={schema} -c TimeZone=UTC"


def connect(schema: str) -> psycopg.Connection[Any]:
    """A raw autocommit connection whose search_path is ``schema``."""
    return psycopg.connect(PG_DSN, autocommit=True, options=_options(schema))


async def aconnect(schema: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True, options=_options(schema))


def create_schema(schema: str) -> None:
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))


def drop_schema(schema: str) -> None:
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextlib.asynccontextmanager
async def open_stores(schema: str) -> AsyncIterator[PostgresStores]:
    """``PostgresStores`` on ``schema``, opened (and so migrated), closed afterwards."""
    stores = PostgresStores(PG_DSN, schema=schema)
    await stores.open()
    try:
        yield stores
    finally:
        await stores.close()


def columns(conn: psycopg.Connection[Any], table: str) -> dict[str, tuple[str, str]]:
    """``column -> (data_type, is_nullable)`` from information_schema, for the current schema."""
    rows = conn.execute(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = %s",
        (table,),
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def plan_nodes(explained: Any) -> Iterator[dict[str, Any]]:
    """Every node of an ``EXPLAIN (FORMAT JSON)`` result, depth first.

    Accepts the whole result (a list of one ``{"Plan": ...}``), one ``{"Plan": ...}`` or a
    node; follows ``Plans`` (children, init plans and sub plans alike).
    """
    if isinstance(explained, list):
        for item in explained:
            yield from plan_nodes(item)
        return
    node = explained.get("Plan", explained)
    yield node
    for child in node.get("Plans", ()):
        yield from plan_nodes(child)


def node_types(explained: Any) -> list[str]:
    return [n["Node Type"] for n in plan_nodes(explained)]


def index_names(explained: Any) -> set[str]:
    return {n["Index Name"] for n in plan_nodes(explained) if "Index Name" in n}
