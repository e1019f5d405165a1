"""Building stores from a URL: ``sqlite:///path/flowx.db``, ``postgresql://…``, ``memory://``.

The store is one URL (``--db`` / ``FLOWX_DATABASE_URL``); a backend is imported only when its
URL is used, so the embedded default needs no extra.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flowx.errors import FlowXError
from flowx.stores.memory import MemoryStores
from flowx.stores.paired import with_leases

__all__ = ["from_url", "memory", "postgres", "redis_leases", "sharded", "sqlite", "with_leases"]
from flowx.stores.protocols import Stores
from flowx.stores.sqlite import SqliteStores
from flowx.urls import (
    BadURL,
    check_postgres,
    check_redis,
    check_sqlite_path,
    check_text,
    redact,
    take_params,
)

DEFAULT_URL = "sqlite:///flowx.db"
#: ``sharded:URL,URL,...``: a comma that starts another ``postgres(ql)://`` URL separates
#: shards; any other comma is the URL's own (libpq's ``host1,host2`` failover list).
SHARDED_PREFIX = "sharded:"
_NEXT_SHARD = re.compile(r",(?=postgres(?:ql)?://)")


def sqlite(path: str | Path = "flowx.db", *, migrate: bool = True) -> SqliteStores:
    """The embedded default: one SQLite file as journal, lease store and recovery index.

    A path that is a directory or cannot be written is refused here (``BadURL``)."""
    return SqliteStores(check_sqlite_path(path), migrate=migrate)


def memory() -> MemoryStores:
    """An in-memory store for tests: this process only, keeps nothing."""
    return MemoryStores()


def _take_param(url: str, name: str) -> tuple[str, str | None]:
    """Split FlowX's own query parameter off a server URL (the driver would refuse it),
    leaving the rest of the URL (``sslrootcert=``, ``ssl_ca_certs=``, ...) as written."""
    clean, values = take_params(url, lambda key: key == name)
    return clean, values.get(name)


def postgres(dsn: str, *, schema: str | None = None, migrate: bool = True, **pool: Any) -> Stores:
    """The production store. ``schema`` (default ``flowx``, or ``?flowx_schema=`` in the URL)
    is the PostgreSQL schema FlowX keeps its tables in. Needs ``flowx-runtime[postgres]``.

    ``pool`` takes the pool's sizes and, by name, any session limit (``connect_timeout=2``,
    ``lock_timeout_ms=…``): those are grouped into the store's ``SessionLimits`` here, so a
    caller need not import the backend to set one."""
    try:
        from flowx.stores.postgres import PostgresStores
        from flowx.stores.postgres.database import SessionLimits
    except ImportError as exc:
        raise FlowXError(
            f"the PostgreSQL store needs psycopg: pip install 'flowx-runtime[postgres]' ({exc})",
            code="store.not_available",
        ) from exc
    chosen = check_postgres(dsn, schema)
    clean, _ = _take_param(dsn, "flowx_schema")
    named = {f.name for f in dataclasses.fields(SessionLimits)}
    limits = {k: pool.pop(k) for k in list(pool) if k in named}
    if limits:
        base = pool.get("limits") or SessionLimits()
        pool["limits"] = dataclasses.replace(base, **limits)
    return PostgresStores(clean, schema=chosen, migrate=migrate, **pool)


def sharded(
    urls: Sequence[str],
    *,
    by: str = "tenant",
    schema: str | None = None,
    migrate: bool = True,
    pins: Mapping[str, int] | None = None,
    **pool: Any,
) -> Stores:
    """A journal sharded by tenant over several PostgreSQL primaries (R6.2, R9.9): each
    instance lives on the shard of its tenant, for good (its id names it). ``urls`` are the
    shards in order; the order is part of the data: name the same URLs in the same order on
    every node and tool. ``pins`` (tenant → shard index) overrides the hash for those tenants
    (README "Sharding the journal"). Every other argument is ``postgres``'s, for each shard."""
    if by != "tenant":
        raise BadURL(f"a journal is sharded by 'tenant', not {by!r}", url=str(by))
    if isinstance(urls, str):
        urls = split_sharded(urls)
    if not urls:
        raise BadURL("a sharded store needs at least one postgresql:// URL", url="")
    if len(set(urls)) != len(urls):
        raise BadURL(
            "a sharded store names the same URL twice; each shard is its own database",
            url=redact(",".join(urls)),
        )
    from flowx.stores.sharded import ShardedStores

    shards = [postgres(u, schema=schema, migrate=migrate, **dict(pool)) for u in urls]
    try:
        return ShardedStores(shards, pins=pins)
    except ValueError as exc:
        raise BadURL(str(exc), url=redact(",".join(urls))) from exc


def split_sharded(url: str) -> list[str]:
    """The shard URLs of ``sharded:URL,URL,...`` (or of the list without the prefix)."""
    body = url.removeprefix(SHARDED_PREFIX)
    parts = [p for p in _NEXT_SHARD.split(body) if p]
    for part in parts:
        if not part.startswith(("postgres://", "postgresql://")):
            raise BadURL(
                f"{redact(part)!r} is not a shard URL; write "
                "sharded:postgresql://host1/db,postgresql://host2/db",
                url=redact(url),
            )
    return parts


def redis_leases(url: str = "redis://127.0.0.1:6379/0", **kw: Any) -> Any:
    """A Redis lease store (``flowx-runtime[redis]``), to pair with a journal: ``with_leases``.

    ``?flowx_prefix=`` in the URL names the key prefix (default ``flowx``)."""
    try:
        from flowx.stores.redis import RedisLeaseStore
    except ImportError as exc:
        raise FlowXError(
            f"the Redis lease store needs redis-py: pip install 'flowx-runtime[redis]' ({exc})",
            code="store.not_available",
        ) from exc
    check_redis(url, "Redis lease store")
    clean, named = _take_param(url, "flowx_prefix")
    if named:
        kw.setdefault("prefix", named)
    return RedisLeaseStore(clean, **kw)


def from_url(url: str, *, migrate: bool = True, leases: str | None = None) -> Stores:
    """Build the stores a URL names; raise ``FlowXError`` saying which forms exist.

    ``leases`` (``redis://…``) takes leases from Redis instead of the journal's own database.
    Every node and tool that touches the same instances must name the same lease store.
    """
    check_text(url, "store")
    if leases:
        check_text(leases, "lease store")
        if not leases.startswith(("redis://", "rediss://", "unix://")):
            raise BadURL(
                f"unknown lease store URL {redact(leases)!r}; use redis://host:6379/0",
                url=redact(leases),
            )
        return with_leases(from_url(url, migrate=migrate), redis_leases(leases))
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        if not path:
            raise BadURL("sqlite URL has no path; write sqlite:///flowx.db", url=url)
        return sqlite(path, migrate=migrate)
    if url.startswith("sqlite://"):
        raise BadURL(
            f"{redact(url)!r}: a sqlite URL has three slashes before a relative path "
            "(sqlite:///flowx.db) and four before an absolute one (sqlite:////var/flowx.db)",
            url=redact(url),
        )
    if url in ("memory://", "memory:"):
        return memory()
    if url.startswith(("postgres://", "postgresql://")):
        return postgres(url, migrate=migrate)
    if url.startswith(SHARDED_PREFIX):
        return sharded(split_sharded(url), migrate=migrate)
    raise BadURL(
        f"unknown store URL {redact(url)!r}; use sqlite:///path/to/flowx.db, "
        "postgresql://..., sharded:postgresql://...,postgresql://... or memory://",
        url=redact(url),
    )
