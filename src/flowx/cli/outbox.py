"""``flowx outbox``: what waits to be published, and the dead letters a broker refused (R5.5)."""

from __future__ import annotations

import click

from flowx.cli.app import db_option, output_option
from flowx.cli.connect import open_stores
from flowx.cli.exits import run
from flowx.cli.render import dead_letters_text, emit_json, event_dict
from flowx.errors import DeadLetterNotFound
from flowx.stores.records import EventRecord


@click.group()
def outbox() -> None:
    """The transactional outbox: what waits to be published, and dead letters (R5.5)."""


@outbox.command("dead-letters")
@db_option
@output_option
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
def dead_letters(db: str, output: str, limit: int) -> None:
    """List events a broker refused for good, oldest first, with the broker's reason."""

    async def main() -> tuple[int, list[EventRecord]]:
        async with open_stores(db, create=False) as stores:
            return await stores.outbox.pending_count(), list(
                await stores.outbox.dead_letters(limit=limit)
            )

    pending, dead = run(main())
    events = [event_dict(e) for e in dead]
    if output == "json":
        emit_json({"pending": pending, "dead_letters": events})
        return
    if not dead:
        click.echo(f"no dead letters ({pending} event(s) pending)")
        return
    click.echo(dead_letters_text(events))
    click.echo(f"{len(dead)} dead letter(s); {pending} event(s) pending", err=True)


@outbox.command("retry")
@click.argument("event_id")
@db_option
@output_option
def retry(event_id: str, db: str, output: str) -> None:
    """Put a dead letter back in the queue, once its cause is fixed. It is resent after any
    newer event of its key that already went out."""

    async def main() -> None:
        async with open_stores(db) as stores:
            if not await stores.outbox.retry_dead_letter(event_id):
                raise DeadLetterNotFound(event_id)

    run(main())
    if output == "json":
        emit_json({"event_id": event_id, "requeued": True})
    else:
        click.echo(f"{event_id}: back in the outbox; the next publisher round sends it")
