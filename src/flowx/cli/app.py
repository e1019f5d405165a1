"""The ``flowx`` click group and the options every command group shares.

The commands themselves live one module per group (``worker``, ``instances``, ``signals``,
``outbox``, ``db``) and are attached in ``flowx.cli.main``, so this module imports none of
them and each of them can import the options from here without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from flowx._version import __version__
from flowx.cli import inputs
from flowx.hosting.stores import DEFAULT_URL

db_option = click.option(
    "--db",
    "--dsn",
    "db",
    envvar="FLOWX_DATABASE_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Store URL: sqlite:///path.db or postgresql://...; also FLOWX_DATABASE_URL.",
)
leases_option = click.option(
    "--leases",
    "leases",
    envvar="FLOWX_LEASES_URL",
    default=None,
    help="Take leases from Redis (redis://host:6379/0) instead of the store; also "
    "FLOWX_LEASES_URL. Every worker and tool on one journal must name the same one.",
)


def output_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``-o text|json``, with ``--json`` as the short way to say ``-o json``.

    Both options write the one ``output`` parameter, so a command sees a single value.
    """
    fn = click.option("--json", "output", flag_value="json", help="Same as -o json.")(fn)
    return click.option(
        "-o",
        "--output",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        help="text for people, json (one document) for scripts.",
    )(fn)


flows_option = click.option(
    "--flows",
    "flows",
    multiple=True,
    required=True,
    metavar="MODULE:ATTR",
    help="Where the flow plans are, e.g. myapp.flows:FLOWS. Repeatable.",
)

#: ``--flows`` where a command can do without the flows' code, and does more with it.
optional_flows_option = click.option(
    "--flows",
    "flows",
    multiple=True,
    metavar="MODULE:ATTR",
    help="Where the flow plans are, e.g. myapp.flows:FLOWS (repeatable). With them, the "
    "command runs a compensation it would otherwise leave to a worker.",
)


@click.group(cls=inputs.TextArgsGroup)
@click.version_option(version=__version__, prog_name="flowx")
def cli() -> None:
    """FlowX: durable flows. A crash loses nothing; a zombie writes nothing."""
