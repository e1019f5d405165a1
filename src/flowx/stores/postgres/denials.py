"""A refused privilege (SQLSTATE 42501) as a FlowX error that says which grant is missing.

A node running as a least-privilege role (R9.8) that lacks one grant fails the same way on
every try: it is a configuration fault, so it leaves as ``StorePermissionDenied`` naming the
login, what the server refused and the group role (``flowx migrate --roles``) that allows
it — never as a driver traceback, and never retried as if the database were down.
"""

from __future__ import annotations

import re
from typing import Final

import psycopg

from flowx.stores.errors import StorePermissionDenied
from flowx.stores.postgres.roles import SEQUENCE_GRANTS, TABLE_GRANTS, role_names

_OBJECT: Final = re.compile(
    r"(permission denied for|must be owner of) (table|relation|sequence|schema|function|"
    r"database|view) \"?([^\s\"]+)\"?"
)


def denied(
    exc: psycopg.errors.InsufficientPrivilege,
    *,
    login: str | None,
    schema: str,
    where: str,
    job: str | None = None,
) -> StorePermissionDenied:
    """The error for ``exc``; role names assume the default prefix (the schema's name)."""
    refused = (exc.diag.message_primary or str(exc)).strip()
    who = f"PostgreSQL role {login!r}" if login else "the PostgreSQL role FlowX logged in as"
    doing = f" ({job})" if job else ""
    message = (
        f"{who} was refused{doing} at {where}, schema {schema!r}: {refused}. "
        f"{_fix(refused, login or '<login>', schema)} (role names as `flowx migrate --roles` "
        f"makes them with the default prefix {schema!r}; see README, Database roles)"
    )
    return StorePermissionDenied(message, login=login, refused=refused)


def _fix(refused: str, login: str, schema: str) -> str:
    names = role_names(schema)
    found = _OBJECT.search(refused)
    if found is None:
        worker = names["worker"]
        return f"Grant {login} the FlowX group role for its job, e.g. GRANT {worker} TO {login}"
    verb, kind, name = found.groups()
    owner = names["owner"]
    if verb == "must be owner of" or kind == "database":
        return (
            f"Only the schema's owner changes or creates it: run `flowx migrate --db ...` as a "
            f"member of {owner} (GRANT {owner} TO <deployer>) before starting nodes as {login}"
        )
    if kind == "schema":
        return (
            f"Each FlowX role may use the schema; grant {login} the one for its job: "
            f"GRANT {names['worker']} TO {login} (run flows), {names['publisher']} (outbox), "
            f"{names['retention']} (retention sweep) or {names['reader']} (read commands); "
            f"DDL is {owner}'s alone"
        )
    held = [
        (names[kind_], privileges)
        for kind_, tables in TABLE_GRANTS.items()
        for table, privileges in tables.items()
        if table == name
    ]
    held += [(names[kind_], ("USAGE",)) for kind_, seqs in SEQUENCE_GRANTS.items() if name in seqs]
    if kind != "sequence":
        held.append((names["reader"], ("SELECT",)))
    holders = [f"{role} ({', '.join(privileges)})" for role, privileges in held]
    # The example: the role that may do most with it (a write refused is the usual case).
    first = max(held, key=lambda h: len(h[1]))[0]
    return (
        f"The roles that may use {name}: {', '.join(holders)}; grant {login} the one for "
        f"this job, e.g. GRANT {first} TO {login}"
    )
