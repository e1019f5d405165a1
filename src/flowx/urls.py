"""Store, lease and publisher URLs checked before any driver sees them.

A URL is configuration: a mistake in it (``postgresql://[::1``, ``?flowx_schema=Bad-Name``,
``redis://host/abc``) can never succeed on a retry, so it is refused at once with
``BadURL`` naming what is wrong and what to write, rather than surfacing as a driver's
``ValueError`` traceback, a silently ignored part (redis-py reads ``/abc`` as database 0), or
a node that reconnects for ever. Every message shows the URL with its secrets redacted
(``flowx.redaction.redact``, re-exported here): these messages go to logs and terminals.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Final
from urllib.parse import SplitResult, parse_qsl, unquote_plus, urlsplit

from flowx.errors import FlowXError
from flowx.redaction import redact

__all__ = [
    "SCHEMA_NAME",
    "BadURL",
    "check_postgres",
    "check_redis",
    "check_schema",
    "check_sqlite_path",
    "check_text",
    "own",
    "redact",
    "split",
    "take_params",
]

#: A PostgreSQL schema FlowX may keep its tables in: a lower-case SQL identifier, unquoted.
SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
#: Redis ``databases`` is an int in the server's config; anything outside it is a typo.
_MAX_REDIS_DB: Final = 2**31 - 1


class BadURL(FlowXError):
    """A store, lease-store or publisher URL that is malformed or names something unusable.

    ``url`` is the URL with its secrets redacted, safe to log.
    """

    code = "store.bad_url"

    def __init__(self, message: str, *, url: str, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.url = url


def split(url: str, what: str, *, code: str | None = None) -> SplitResult:
    """``urlsplit`` with its ``ValueError`` (an unclosed ``[``, a port that is not a number)
    turned into ``BadURL``."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsed lazily; a bad port raises only here
    except ValueError as exc:
        # urllib's message quotes the part it choked on, which may be a password (in
        # ``u:pw#x@h`` the "port" is ``pw``): say what is wrong in words of our own.
        text = str(exc)
        if "IPv6" in text:
            why = "an IPv6 address is not closed by ']'"
        elif "Port" in text or "port" in text:
            why = "the part after ':' where the port goes is not a number from 0 to 65535"
        else:
            why = "it is malformed"
        shown = redact(url)
        raise BadURL(f"{what} URL {shown!r} cannot be parsed: {why}", url=shown, code=code) from exc
    return parts


def check_text(url: object, what: str) -> str:
    """``url`` if it is a str that can be sent to a driver; else ``BadURL``."""
    if not isinstance(url, str):
        raise BadURL(f"{what} URL must be a str, not {type(url).__name__}", url=repr(url)[:60])
    bad = next((c for c in url if c == "\x00" or "\ud800" <= c <= "\udfff"), None)
    if bad is not None:
        raise BadURL(
            f"{what} URL {redact(url)!r} holds {bad!r}, which no driver accepts "
            "(a NUL byte, or bytes that are not UTF-8)",
            url=redact(url),
        )
    return url


def check_postgres(url: str, schema: str | None = None) -> str:
    """Check a ``postgresql://`` URL and the schema FlowX will use (``schema`` or
    ``?flowx_schema=``); return that schema name."""
    check_text(url, "PostgreSQL")
    parts = split(url, "PostgreSQL")
    named = [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "flowx_schema"]
    chosen = schema or (named[-1] if named else None) or "flowx"
    check_schema(chosen, url)
    _check_conninfo(url)
    return chosen


def _check_conninfo(url: str) -> None:
    """libpq's own parse of the DSN (FlowX's ``flowx_*`` parameters aside): an unknown
    parameter (``?foo=bar``) would otherwise fail every connection attempt, and surface only
    as a pool that never filled."""
    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # the store itself says psycopg is missing
        return
    parts = split(url, "PostgreSQL")
    try:
        conninfo_to_dict(take_params(url, own)[0] if parts.scheme else url)
    except ProgrammingError as exc:
        shown = redact(url)
        # libpq's message may quote part of the DSN ("missing = after "pw""): every spelling
        # of the URL's secrets, and a quoted word of one, is hidden.
        detail = redact(" ".join(str(exc).split()), secrets_of=(url,), limit=None)
        raise BadURL(f"PostgreSQL URL {shown!r} is not valid: {detail}", url=shown) from exc


def own(name: str) -> bool:
    """A query parameter FlowX reads itself (``flowx_schema``, ``flowx_prefix``): no driver
    knows it, so it is taken off before the URL is handed on."""
    return name.startswith("flowx_")


def take_params(url: str, taken: Callable[[str], bool]) -> tuple[str, dict[str, str]]:
    """Split the query parameters ``taken`` names off ``url``; return the URL handed to the
    driver and the values taken (the last of each name wins).

    Every other byte of the URL is kept exactly as written. Decoding the query and encoding it
    again is not neutral: ``urlencode`` writes a space as ``+``, which libpq reads as a plus
    (``sslrootcert=/etc/my%20certs/ca.pem`` would name a file that does not exist), and
    ``urlunsplit`` turns ``postgresql:///db`` (no host: a Unix socket) into ``postgresql:/db``.
    The split follows ``urlsplit``: the fragment starts at the first ``#``, the query at the
    first ``?`` before it, parameters are separated by ``&``.
    """
    base, hash_sign, fragment = url.partition("#")
    head, question, query = base.partition("?")
    kept: list[str] = []
    values: dict[str, str] = {}
    for piece in query.split("&") if query else []:
        name, _, value = piece.partition("=")
        if taken(unquote_plus(name)):
            values[unquote_plus(name)] = unquote_plus(value)
        else:
            kept.append(piece)
    rest = "&".join(kept)
    return f"{head}{question if rest else ''}{rest}{hash_sign}{fragment}", values


def check_schema(schema: object, url: str = "") -> str:
    """A schema name FlowX can put in ``search_path`` unquoted, or ``BadURL``."""
    if not isinstance(schema, str) or not SCHEMA_NAME.fullmatch(schema):
        raise BadURL(
            f"schema name {schema!r} must be a lower-case SQL identifier of at most 63 "
            "characters (letters a-z, digits, '_'; not starting with a digit), e.g. "
            "?flowx_schema=flowx_orders",
            url=redact(url),
            code="store.bad_schema",
        )
    return schema


def check_redis(url: str, what: str = "Redis", *, code: str | None = None) -> str:
    """Check a ``redis://``, ``rediss://`` or ``unix://`` URL; in particular its database
    index, which redis-py would otherwise ignore when it is not a number."""
    check_text(url, what)
    parts = split(url, what, code=code)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise BadURL(
            f"{what} URL {redact(url)!r} has scheme {parts.scheme!r}; use "
            "redis://host:6379/0, rediss://... or unix:///path/redis.sock?db=0",
            url=redact(url),
            code=code,
        )
    index = [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "db"]
    db = index[-1] if index else None
    if db is None and parts.scheme != "unix":
        db = parts.path.strip("/") or None
    if db is not None and not (db.isascii() and db.isdigit() and int(db) <= _MAX_REDIS_DB):
        raise BadURL(
            f"{what} URL {redact(url)!r}: database index {db!r} is not a number from 0 to "
            "the server's 'databases' setting (16 by default); write e.g. redis://host:6379/0",
            url=redact(url),
            code=code,
        )
    return url


def check_sqlite_path(path: str | Path) -> Path:
    """A path SQLite can open as a journal: not a directory, not in an unwritable folder.

    A missing folder is left to the store, which says so and keeps retrying (a volume may be
    mounted later); a directory or a folder no one may write in never becomes usable.
    """
    if isinstance(path, str):
        check_text(path, "SQLite")
    target = Path(path)
    shown = redact(str(path))
    try:
        return _usable_sqlite_path(target, shown)
    except OSError as exc:  # a name too long, a loop of links, ...
        raise BadURL(
            f"SQLite path {shown!r} cannot be used: {exc.strerror or exc}", url=shown
        ) from exc


def _usable_sqlite_path(target: Path, shown: str) -> Path:
    if target.is_dir():
        raise BadURL(
            f"SQLite path {shown!r} is a directory; name a file in it, e.g. "
            f"sqlite:///{(target / 'flowx.db').as_posix()}",
            url=shown,
        )
    if target.exists() and not target.is_file():
        raise BadURL(
            f"SQLite path {shown!r} is not a regular file (a device, a socket, a pipe); "
            "name a file, e.g. sqlite:///flowx.db",
            url=shown,
        )
    folder = target.parent
    if folder.is_dir() and not _writable(target, folder):
        raise BadURL(
            f"SQLite path {shown!r} cannot be written: "
            f"{'the file' if target.exists() else 'its folder'} is not writable by this "
            "process; fix the permissions or choose another path",
            url=shown,
        )
    return target


def _writable(target: Path, folder: Path) -> bool:
    """SQLite writes the file and, beside it, its ``-wal`` and ``-shm`` files. (``os.access``
    never refuses root; the store itself turns a failed open into ``BadURL`` too.)"""
    if target.exists() and not os.access(target, os.W_OK):
        return False
    return os.access(folder, os.W_OK | os.X_OK)
