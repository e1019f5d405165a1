"""Least-privilege group roles for one FlowX schema (R9.8): who may change what.

``flowx migrate --roles`` creates five NOLOGIN group roles per schema, named
``<prefix>_<kind>`` (the prefix defaults to the schema's name, so two schemas in one cluster
never share roles; roles are cluster-wide, schemas are not):

* ``owner`` owns the schema and every object in it: the only role that runs DDL.
* ``worker`` runs flows: reads and writes instances, steps, leases, signals and stages outbox
  events. It never deletes and never runs DDL or TRUNCATE.
* ``publisher`` drains the outbox (claim, mark published, dead letters) and keeps the change
  feed's cursors.
* ``retention`` deletes ended instances past their window (after reading them for the archive)
  and published outbox events, and holds the sweep's lease.
* ``reader`` reads every table: ``flowx list``/``show``/``count``/``doctor``.

Operators grant the group roles to their LOGIN users (``GRANT flowx_worker TO app``), one or
several per login. The grants are replaced as a whole (``REVOKE ALL`` then ``GRANT``) in one
transaction, so running it again is harmless and leaves exactly what the table below says.

Why re-granting rather than ``ALTER DEFAULT PRIVILEGES``: the worker, publisher and retention
roles get privileges table by table, and default privileges can only say "every new table".
So the migration runner calls ``regrant`` after applying migrations whenever the schema is
owned by a ``<prefix>_owner`` role: a table a later migration adds gets its grants in the same
transaction that creates it, and nobody sees it without them.

Timeouts: PostgreSQL applies ``ALTER ROLE ... SET`` only to the role that logs in — a member
does not inherit a group role's settings — so they are set on the LOGIN users named with
``--grant KIND=LOGIN`` (``ROLE_TIMEOUTS`` below says each value and why). FlowX's own
connections also send their ``SessionLimits`` at connect, which take precedence; the login's
settings bound every other session under that name (psql, a BI tool on the reader login).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from psycopg import AsyncConnection, sql

from flowx.errors import RequestInvalid

KINDS: Final = ("owner", "worker", "publisher", "retention", "reader")

#: Privileges per role kind and table. ``reader`` gets SELECT on every table instead.
#: Every role reads ``flowx_schema_migrations``: opening a store checks the schema version.
TABLE_GRANTS: Final[Mapping[str, Mapping[str, tuple[str, ...]]]] = {
    "worker": {
        "flowx_schema_migrations": ("SELECT",),
        "flow_instance": ("SELECT", "INSERT", "UPDATE"),
        "flow_step": ("SELECT", "INSERT"),
        "flow_lease": ("SELECT", "INSERT", "UPDATE"),
        "flow_signal": ("SELECT", "INSERT"),
        # Staged in the step's own commit; publishing is the publisher's.
        "outbox_event": ("SELECT", "INSERT"),
        "retention_policy": ("SELECT",),
    },
    "publisher": {
        "flowx_schema_migrations": ("SELECT",),
        # The claim locks rows (FOR UPDATE needs UPDATE); marks, refusals and dead-letter
        # retries are updates of outbox rows only.
        "outbox_event": ("SELECT", "UPDATE"),
        "change_cursor": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    },
    "retention": {
        "flowx_schema_migrations": ("SELECT",),
        # Deleting an instance cascades to its steps, signals and events: the cascade runs with
        # the tables' owner's rights, so those need only SELECT here (the archive reads them).
        # Taking the sweep's lease raises the fence of an instance of that id (R2.4), so
        # that one column may be updated: never an instance's state or history.
        "flow_instance": ("SELECT", "DELETE", "UPDATE (fence)"),
        "flow_step": ("SELECT",),
        "flow_signal": ("SELECT",),
        "outbox_event": ("SELECT", "DELETE"),
        "change_cursor": ("SELECT",),
        "retention_policy": ("SELECT", "INSERT", "UPDATE"),
        # One node sweeps at a time: it holds a lease row, and an instance's lease row goes
        # with the instance.
        "flow_lease": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    },
}
#: Sequences a role's inserts draw from (``outbox_event.staged_seq``'s default).
SEQUENCE_GRANTS: Final[Mapping[str, tuple[str, ...]]] = {
    "worker": ("outbox_event_staged_seq",),
}


@dataclass(frozen=True, slots=True)
class RoleTimeouts:
    """Session settings for a LOGIN user of one role kind (``ALTER ROLE login SET``)."""

    statement_timeout: str
    lock_timeout: str
    idle_in_transaction_session_timeout: str

    def as_ms(self) -> dict[str, int]:
        """Each setting in milliseconds, to compare two roles' values."""
        return {
            "statement_timeout": _ms(self.statement_timeout),
            "lock_timeout": _ms(self.lock_timeout),
            "idle_in_transaction_session_timeout": _ms(self.idle_in_transaction_session_timeout),
        }


#: Why each value (FlowX's default lease TTL is 30 s):
#: * owner: a migration may build an index over a large journal, so an hour; but its DDL waits
#:   5 s at most for a lock, because a DDL statement queued for its lock blocks every worker
#:   behind it — better to fail and run ``flowx migrate`` again.
#: * worker: 20 s, below the lease TTL: a statement still running when the lease would have
#:   lapsed is cancelled rather than committing after a peer took over (the fence refuses it
#:   anyway; this frees the connection). Idle in a transaction 10 s: a dead worker's row locks
#:   go before a takeover would need them.
#: * publisher: as the worker; its claim transaction is open while a batch is sent, and FlowX
#:   bounds that itself.
#: * retention: a page of deletes cascades over steps, signals and events: 5 minutes.
#: * reader: a person's ad hoc query may scan: 5 minutes; never holding locks others wait for
#:   long (idle in a transaction 1 minute).
ROLE_TIMEOUTS: Final[Mapping[str, RoleTimeouts]] = {
    "owner": RoleTimeouts("1h", "5s", "1min"),
    "worker": RoleTimeouts("20s", "5s", "10s"),
    "publisher": RoleTimeouts("20s", "5s", "10s"),
    "retention": RoleTimeouts("5min", "5s", "1min"),
    "reader": RoleTimeouts("5min", "5s", "1min"),
}

_UNITS: Final = {"ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000}


def _ms(value: str) -> int:
    found = re.fullmatch(r"(\d+)(ms|s|min|h)", value)
    assert found is not None, value  # nosec B101  # invariant: the timeouts are our constants
    return int(found[1]) * _UNITS[found[2]]


#: A prefix is a lower-case identifier short enough for ``_publisher`` (10) and ``_retention``
#: to fit in PostgreSQL's 63 characters.
_PREFIX: Final = re.compile(r"[a-z_][a-z0-9_]{0,51}")
#: A login named on the command line: any role name, but no quotes or control characters.
_LOGIN: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_$.-]{0,62}")


def role_names(prefix: str) -> dict[str, str]:
    """``kind -> role name`` for a prefix."""
    return {kind: f"{prefix}_{kind}" for kind in KINDS}


def check_prefix(prefix: str) -> str:
    if not _PREFIX.fullmatch(prefix):
        raise RequestInvalid(
            f"role prefix {prefix!r} must be a lower-case SQL identifier of at most 52 "
            "characters (a-z, digits, '_'; not starting with a digit), e.g. --role-prefix "
            "flowx_orders"
        )
    return prefix


def check_grants(grants: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """``(kind, login)`` pairs, each kind known and each login a plain role name."""
    checked = []
    for kind, login in grants:
        if kind not in KINDS:
            raise RequestInvalid(
                f"unknown role kind {kind!r} in --grant {kind}={login}; use one of "
                f"{', '.join(KINDS)} (e.g. --grant worker=app)"
            )
        if not _LOGIN.fullmatch(login):
            raise RequestInvalid(
                f"login {login!r} in --grant {kind}={login} is not a plain role name "
                "(letters, digits, '_', '$', '.', '-'; at most 63)"
            )
        checked.append((kind, login))
    return checked


async def _rows(conn: AsyncConnection[Any], query: str, *args: Any) -> list[tuple[Any, ...]]:
    return await (await conn.execute(query.encode(), args)).fetchall()


async def role_prefix_of(conn: AsyncConnection[Any], schema: str) -> str | None:
    """The prefix of the roles managing ``schema``: its owner is ``<prefix>_owner`` and every
    other ``<prefix>_<kind>`` exists. ``None`` for a schema no ``--roles`` has touched."""
    rows = await _rows(
        conn,
        "SELECT r.rolname FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner "
        "WHERE n.nspname = %s",
        schema,
    )
    if not rows or not str(rows[0][0]).endswith("_owner"):
        return None
    prefix = str(rows[0][0]).removesuffix("_owner")
    names = list(role_names(prefix).values())
    found = await _rows(conn, "SELECT count(*) FROM pg_roles WHERE rolname = ANY(%s)", names)
    return prefix if int(found[0][0]) == len(names) else None


async def create_roles(conn: AsyncConnection[Any], schema: str, prefix: str) -> dict[str, str]:
    """Create the group roles (if missing), hand the schema to the owner role and grant the
    rest, inside the caller's transaction (which holds the migration lock)."""
    names = role_names(check_prefix(prefix))
    existing = {
        r[0]
        for r in await _rows(
            conn, "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", list(names.values())
        )
    }
    for name in names.values():
        if name not in existing:
            await conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(name)))
    owner = names["owner"]
    member = await _rows(conn, "SELECT pg_has_role(current_user, %s, 'MEMBER')", owner)
    if not member[0][0]:
        # Handing objects to a role needs membership in it; keeping it lets this login
        # migrate later (the runner SETs ROLE to the schema's owner).
        await conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(sql.Identifier(owner)))
    await _give_to_owner(conn, schema, owner)
    await regrant(conn, schema, prefix)
    return names


async def _give_to_owner(conn: AsyncConnection[Any], schema: str, owner: str) -> None:
    """The schema, its tables, standalone sequences and functions, owned by ``owner``.
    Indexes, and sequences that belong to a column, follow their table."""
    to = sql.Identifier(owner)
    await conn.execute(sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(sql.Identifier(schema), to))
    relations = await _rows(
        conn,
        "SELECT c.relname, c.relkind FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
        "AND c.relkind IN ('r', 'p', 'v', 'm', 'S') AND NOT EXISTS ("
        "SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass "
        "AND d.objid = c.oid AND d.deptype IN ('a', 'i')) ORDER BY c.relkind, c.relname",
        schema,
    )
    for name, kind in relations:
        what = "SEQUENCE" if kind == "S" else "TABLE"
        await conn.execute(
            sql.SQL("ALTER {} {}.{} OWNER TO {}").format(
                sql.SQL(what), sql.Identifier(schema), sql.Identifier(name), to
            )
        )
    functions = await _rows(
        conn,
        "SELECT p.oid::regprocedure::text FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s",
        schema,
    )
    for (signature,) in functions:
        # regprocedure's text is the function's own qualified, quoted signature.
        await conn.execute(sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(sql.SQL(signature), to))


async def regrant(conn: AsyncConnection[Any], schema: str, prefix: str) -> None:
    """Replace the non-owner roles' privileges with ``TABLE_GRANTS`` (one transaction)."""
    names = role_names(prefix)
    s = sql.Identifier(schema)
    others = sql.SQL(", ").join(sql.Identifier(names[k]) for k in KINDS if k != "owner")
    await conn.execute(sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA {} FROM {}").format(s, others))
    await conn.execute(
        sql.SQL("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {} FROM {}").format(s, others)
    )
    await conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM {}").format(s, others))
    await conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, others))
    await conn.execute(
        sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(
            s, sql.Identifier(names["reader"])
        )
    )
    for kind, tables in TABLE_GRANTS.items():
        for table, privileges in tables.items():
            await conn.execute(
                sql.SQL("GRANT {} ON {}.{} TO {}").format(
                    sql.SQL(", ").join(sql.SQL(p) for p in privileges),
                    s,
                    sql.Identifier(table),
                    sql.Identifier(names[kind]),
                )
            )
    for kind, sequences in SEQUENCE_GRANTS.items():
        for sequence in sequences:
            await conn.execute(
                sql.SQL("GRANT USAGE ON SEQUENCE {}.{} TO {}").format(
                    s, sql.Identifier(sequence), sql.Identifier(names[kind])
                )
            )


async def grant_logins(
    conn: AsyncConnection[Any], prefix: str, grants: Sequence[tuple[str, str]]
) -> dict[str, dict[str, str]]:
    """Make each login a member of its group roles and set its session timeouts.

    A login given several kinds gets, per setting, the longest of their values: none of its
    jobs is cut off, and FlowX's own sessions bring their own limits anyway.
    Returns ``login -> setting -> value``."""
    names = role_names(prefix)
    chosen: dict[str, dict[str, str]] = {}
    for kind, login in check_grants(grants):
        await conn.execute(
            sql.SQL("GRANT {} TO {}").format(sql.Identifier(names[kind]), sql.Identifier(login))
        )
        values = chosen.setdefault(login, {})
        timeouts = ROLE_TIMEOUTS[kind]
        for setting, ms in timeouts.as_ms().items():
            if setting not in values or _ms(values[setting]) < ms:
                values[setting] = getattr(timeouts, setting)
    for login, values in chosen.items():
        for setting, value in values.items():
            await conn.execute(
                sql.SQL("ALTER ROLE {} SET {} = {}").format(
                    sql.Identifier(login), sql.Identifier(setting), sql.Literal(value)
                )
            )
    return chosen
