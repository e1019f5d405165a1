"""``flowx keys``: the AES-256 keys that seal sensitive members at rest (R9.8).

Rotation is a configuration change: put the new key first in ``encryption_keys`` and keep the
old ones after it. New writes take the new key at once; rows written before stay sealed under
the old one until retention deletes them. ``rotate-check`` says how much of the journal each
key still seals, so an operator knows when an old key can be dropped (when it seals nothing).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import click

from flowx import sealing
from flowx.cli.app import db_option, output_option
from flowx.cli.connect import open_stores
from flowx.cli.exits import EXIT_ERROR, run
from flowx.cli.render import emit_json, table
from flowx.hosting.settings import HostSettings
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import ArchivedInstance

#: Instances read per page while counting.
PAGE = 200


@click.group()
def keys() -> None:
    """The keys that seal sensitive members at rest (R9.8): make one, check a rotation."""


@keys.command("generate")
@click.option("--id", "key_id", default="k1", show_default=True, help="The key's id.")
def generate(key_id: str) -> None:
    """Print a new key as 'id:base64', for encryption_keys (FLOWX_ENCRYPTION_KEYS). To
    rotate, put it first and keep the old keys after it."""
    click.echo(f"{key_id}:{sealing.generate_key()}")


def _count(found: Counter[str], text: str | None) -> None:
    if text and sealing.MARK in text:
        _walk(found, json.loads(text))


def _walk(found: Counter[str], value: Any) -> None:
    if isinstance(value, dict):
        if sealing.MARK in value:
            found[str(value.get("k"))] += 1
            return
        for v in value.values():
            _walk(found, v)
    elif isinstance(value, list):
        for v in value:
            _walk(found, v)


def _tally(found: Counter[str], item: ArchivedInstance) -> None:
    _count(found, item.instance.input)
    _count(found, item.instance.state_bag)
    for step in item.steps:
        _count(found, step.result)
    for signal in item.signals:
        _count(found, signal.payload)


@keys.command("rotate-check")
@db_option
@output_option
def rotate_check(db: str, output: str) -> None:
    """How many sealed members each key seals in the journal. A key no longer configured
    makes its rows unreadable (exit 1); an old key sealing nothing can be dropped."""
    settings = HostSettings.load()
    keyring = settings.keyring

    async def main() -> Counter[str]:
        found: Counter[str] = Counter()
        async with open_stores(db, create=False) as stores:
            query = InstanceQuery(limit=PAGE)
            while True:
                page = await stores.catalog.list_instances(query)
                if not page:
                    return found
                for item in await stores.retention.contents([r.instance_id for r in page]):
                    _tally(found, item)
                last = page[-1]
                query = InstanceQuery(limit=PAGE, before=(last.created_at, last.instance_id))

    found = run(main())
    configured = list(keyring.keys) if keyring is not None else []
    current = keyring.current if keyring is not None else None
    rows: list[dict[str, Any]] = []
    for key_id in sorted(set(found) | set(configured)):
        status = (
            "current"
            if key_id == current
            else "old: still needed"
            if key_id in configured and found[key_id]
            else "old: can be dropped"
            if key_id in configured
            else "NOT CONFIGURED: unreadable"
        )
        rows.append({"key": key_id, "sealed_members": found[key_id], "status": status})
    unreadable = [r["key"] for r in rows if str(r["status"]).startswith("NOT")]
    if output == "json":
        emit_json({"current": current, "keys": rows, "unreadable": unreadable})
    else:
        click.echo(
            table(["key", "sealed members", "status"], [tuple(r.values()) for r in rows])
            if rows
            else "nothing sealed, and no keys configured"
        )
    if unreadable:
        raise SystemExit(EXIT_ERROR)
