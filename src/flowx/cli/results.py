"""``flowx result``: what an instance ended with, waiting for it to end if asked (and
``await_end``, which ``flowx start --wait`` shares)."""

from __future__ import annotations

import asyncio
import sys
import time

import click

from flowx.cli.app import db_option, output_option
from flowx.cli.connect import open_stores
from flowx.cli.exits import EXIT_ERROR, run
from flowx.cli.render import emit_json
from flowx.errors import IllegalState, InstanceNotFound
from flowx.hosting.documents import result_dict, shown
from flowx.stores.records import InstanceRecord, InstanceState

#: The longest pause between two looks at an instance that has not ended.
POLL_CAP = 0.5


async def await_end(db: str, instance_id: str, wait: float | None) -> InstanceRecord:
    """The instance's record once it has ended; with ``wait=None`` it must have ended now.
    ``IllegalState`` if it has not (within ``wait`` seconds)."""
    async with open_stores(db, create=False) as stores:
        ends = time.monotonic() + (wait or 0.0)
        pause = 0.05
        while True:
            record = await stores.journal.get(instance_id)
            if record is None:
                raise InstanceNotFound(instance_id)
            if record.state.terminal:
                return record
            if wait is None:
                raise IllegalState(
                    f"instance {instance_id} has not ended ({record.state.value}); pass "
                    "--wait SECONDS to wait for it"
                )
            left = ends - time.monotonic()
            if left <= 0:
                raise IllegalState(
                    f"instance {instance_id} is still {record.state.value} after {wait:g}s; "
                    "is a worker that carries its flow running?"
                )
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, POLL_CAP)


def print_result(record: InstanceRecord, output: str) -> None:
    """Print what the instance ended with; exit 1 if it did not complete."""
    doc = result_dict(record)
    if output == "json":
        emit_json(doc)
    elif record.state is InstanceState.COMPLETED:
        click.echo(shown(record.state_bag))
    else:
        click.echo(f"instance {record.instance_id} ended {record.state.value}: {record.error}")
    if record.state is not InstanceState.COMPLETED:
        sys.exit(EXIT_ERROR)


@click.command()
@click.argument("instance_id")
@db_option
@output_option
@click.option(
    "--wait",
    type=click.FloatRange(0, 86_400),
    default=None,
    metavar="SECONDS",
    help="Wait up to this long for the instance to end.",
)
def result(instance_id: str, db: str, output: str, wait: float | None) -> None:
    """Print what an instance ended with: its final state (exit 0) if it completed, its error
    (exit 1) if it ended otherwise. Exits 4 if it has not ended (within --wait), 3 if there
    is no such instance."""
    print_result(run(await_end(db, instance_id, wait)), output)
