"""``flowx migrate``: the store's schema, on its own, before any worker starts."""

from __future__ import annotations

import click

from flowx.cli.app import db_option, output_option
from flowx.cli.connect import open_stores
from flowx.cli.exits import run
from flowx.cli.render import emit_json


@click.command()
@db_option
@output_option
def migrate(db: str, output: str) -> None:
    """Bring a store's schema up to date (refusing one newer than this FlowX).

    Every command migrates on open; this one exists so a deployment can migrate once, before
    any worker starts, and fail loudly there rather than in the first worker.
    """

    async def main() -> tuple[str, int | None]:
        async with open_stores(db) as stores:
            return stores.describe(), await stores.schema_version()

    description, version = run(main())
    if output == "json":
        emit_json({"store": description, "schema_version": version})
    elif version is None:
        click.echo(f"{description}: schema up to date")
    else:
        click.echo(f"{description}: schema up to date (version {version})")
