"""Building stores from a URL: ``sqlite:///path/flowx.db``, ``postgresql://…``, ``memory://``.

The store is one URL (``--db`` / ``FLOWX_DATABASE_URL``); a backend is imported only when its
URL is used, so the embedded default needs no extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from flowx.errors import FlowXError
from flowx.stores.memory import MemoryStores
from flowx.stores.protocols import Stores
from flowx.stores.sqlite import SqliteStores

DEFAULT_URL = "sqlite:///flowx.db"


def sqlite(path: str | Path = "flowx.db", *, migrate: bool = True) -> SqliteStores:
    """The embedded default: one SQLite file as journal, lease store and recovery index."""
    return SqliteStores(path, migrate=migrate)


def memory() -> MemoryStores:
    """An in-memory store for tests: this process only, keeps nothing."""
    return MemoryStores()


def postgres(dsn: str, *, schema: str | None = None, migrate: bool = True, **pool: Any) -> Stores:
    """The production store. ``schema`` (default ``flowx``, or ``?flowx_schema=`` in the URL)
    is the PostgreSQL schema FlowX keeps its tables in. Needs ``flowx[postgres]``."""
    try:
        from flowx.stores.postgres import PostgresStores
    except ImportError as exc:
        raise FlowXError(
            f"the PostgreSQL store needs psycopg: pip install 'flowx[postgres]' ({exc})",
            code="store.not_available",
        ) from exc
    parts = urlsplit(dsn)
    query = parse_qsl(parts.query, keep_blank_values=True)
    named = [v for k, v in query if k == "flowx_schema"]
    rest = [(k, v) for k, v in query if k != "flowx_schema"]
    clean = urlunsplit(parts._replace(query=urlencode(rest)))
    return PostgresStores(
        clean, schema=schema or (named[-1] if named else "flowx"), migrate=migrate, **pool
    )


def from_url(url: str, *, migrate: bool = True) -> Stores:
    """Build the stores a URL names; raise ``FlowXError`` saying which forms exist."""
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        if not path:
            raise FlowXError(
                "sqlite URL has no path; write sqlite:///flowx.db", code="store.bad_url"
            )
        return sqlite(path, migrate=migrate)
    if url.startswith("sqlite://"):
        raise FlowXError(
            f"{url!r}: a sqlite URL has three slashes before a relative path "
            "(sqlite:///flowx.db) and four before an absolute one (sqlite:////var/flowx.db)",
            code="store.bad_url",
        )
    if url in ("memory://", "memory:"):
        return memory()
    if url.startswith(("postgres://", "postgresql://")):
        return postgres(url, migrate=migrate)
    raise FlowXError(
        f"unknown store URL {url!r}; use sqlite:///path/to/flowx.db, postgresql://... or memory://",
        code="store.bad_url",
    )
