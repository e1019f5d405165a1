"""``flowx migrate``: the store's schema, on its own, before any worker starts; and, with
``--roles``, the least-privilege group roles that own and use it (R9.8)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import click

from flowx.cli.app import db_option, output_option
from flowx.cli.connect import open_stores
from flowx.cli.exits import fail, run
from flowx.cli.render import emit_json
from flowx.errors import RequestInvalid


@runtime_checkable
class _RoleManaged(Protocol):
    """A store with database roles (PostgreSQL's)."""

    async def create_roles(
        self, *, prefix: str | None = None, grants: Sequence[tuple[str, str]] = ()
    ) -> dict[str, Any]: ...


def _pairs(given: tuple[str, ...]) -> list[tuple[str, str]]:
    pairs = []
    for item in given:
        kind, sep, login = item.partition("=")
        if not sep or not kind or not login:
            fail(
                RequestInvalid(
                    f"--grant {item!r} must be KIND=LOGIN, e.g. --grant worker=app "
                    "(kinds: owner, worker, publisher, retention, reader)"
                )
            )
        pairs.append((kind.strip(), login.strip()))
    return pairs


@click.command()
@db_option
@output_option
@click.option(
    "--roles",
    is_flag=True,
    help="Also create (idempotently) the schema's NOLOGIN group roles <prefix>_owner, "
    "_worker, _publisher, _retention, _reader and their grants (PostgreSQL; run as a "
    "superuser or a CREATEROLE login that owns the schema).",
)
@click.option(
    "--role-prefix",
    default=None,
    help="Prefix of the role names (default: the schema's name, e.g. flowx_worker).",
)
@click.option(
    "--grant",
    "grants",
    multiple=True,
    metavar="KIND=LOGIN",
    help="Make LOGIN a member of the KIND group role and set its session timeouts "
    "(repeatable; implies --roles).",
)
def migrate(
    db: str, output: str, roles: bool, role_prefix: str | None, grants: tuple[str, ...]
) -> None:
    """Bring a store's schema up to date (refusing one newer than this FlowX).

    This is the one command that runs DDL: a node whose schema is current runs none, so it can
    log in as a role that may only read and write rows. Run it once per release, before any
    worker starts, as the schema's owner.
    """
    pairs = _pairs(grants)
    managed = roles or bool(pairs) or role_prefix is not None

    async def main() -> tuple[str, int | None, dict[str, Any] | None]:
        async with open_stores(db) as stores:
            made = None
            if managed:
                if not isinstance(stores, _RoleManaged):
                    raise RequestInvalid(
                        f"--roles needs a PostgreSQL store; {stores.describe()} has no "
                        "database roles"
                    )
                made = await stores.create_roles(prefix=role_prefix, grants=pairs)
            return stores.describe(), await stores.schema_version(), made

    description, version, made = run(main())
    if output == "json":
        doc: dict[str, Any] = {"store": description, "schema_version": version}
        if made is not None:
            doc.update(made)
        emit_json(doc)
        return
    if version is None:
        click.echo(f"{description}: schema up to date")
    else:
        click.echo(f"{description}: schema up to date (version {version})")
    if made is not None:
        click.echo("group roles (NOLOGIN): " + ", ".join(made["roles"].values()))
        for login, settings in made["logins"].items():
            shown = ", ".join(f"{k}={v}" for k, v in settings.items())
            click.echo(f"login {login}: member, {shown}")
