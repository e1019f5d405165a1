"""``flowx doctor``: is this journal healthy, and is this node's configuration what I think?

One command an operator runs first: whether the store answers and at which schema, the
clock offset to it, instances nobody has written to for longer than a lease (stuck), the
outbox backlog and its dead letters, what retention would delete and what it holds back,
the flow versions still in flight (with ``--flows``: those the given code does not carry),
and the settings as they resolve here. Exits 1 if anything needs attention, naming it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import click

from flowx.cli.app import db_option, optional_flows_option, output_option
from flowx.cli.connect import open_stores, plans_or_fail
from flowx.cli.exits import EXIT_ERROR, run
from flowx.cli.render import emit_json
from flowx.hosting.retention import sweep
from flowx.hosting.settings import HostSettings
from flowx.plan.model import Plan
from flowx.stores.errors import SchemaNotMigrated
from flowx.stores.protocols import InstanceQuery, StoreClock, Stores

#: Stuck instances counted at most (the count says "at least" beyond it).
STUCK_PAGE = 1000


async def examine(db: str, plans: list[Plan], settings: HostSettings) -> dict[str, Any]:
    """Everything ``flowx doctor`` reports, as one document with its ``problems``."""
    problems: list[str] = []
    doc: dict[str, Any] = {"problems": problems, "settings": settings.resolved()}
    async with open_stores(db, create=False) as stores:
        doc["store"] = {
            "describe": stores.describe(),
            "schema_version": await stores.schema_version(),
        }
        doc["clock"] = await _clock(stores, settings, problems)
        doc["instances"] = await stores.catalog.count_instances(InstanceQuery(), by="state")
        stuck = await stores.recovery.find_abandoned(
            now=None, idle_for=settings.lease_ttl * 2, limit=STUCK_PAGE
        )
        doc["stuck"] = {"count": len(stuck), "at_least": len(stuck) == STUCK_PAGE}
        if stuck:
            problems.append(
                f"{len(stuck)}{'+' if len(stuck) == STUCK_PAGE else ''} instance(s) nobody has "
                f"written to for over two lease TTLs ({settings.lease_ttl * 2}); is a worker "
                "that carries their flows running?"
            )
        doc["outbox"] = await _outbox(stores, problems)
        doc["retention"] = await _retention(stores, settings)
        doc["versions"] = await _versions(stores, plans, problems)
    return doc


async def _clock(stores: Stores, settings: HostSettings, problems: list[str]) -> dict[str, Any]:
    if not isinstance(stores, StoreClock):
        return {"offset_s": 0.0, "note": "this store keeps this machine's clock"}
    worst = timedelta(0)
    for _, theirs in await stores.store_clock():
        offset = datetime.now(UTC) - theirs
        worst = max(worst, abs(offset))
    limit = settings.clock_offset_limit
    if worst > limit:
        problems.append(f"this machine's clock is {worst} off the store's (limit {limit})")
    return {"offset_s": round(worst.total_seconds(), 3), "limit_s": limit.total_seconds()}


async def _outbox(stores: Stores, problems: list[str]) -> dict[str, Any]:
    pending = await stores.outbox.pending_count()
    dead = len(await stores.outbox.dead_letters(limit=1000))
    if dead:
        problems.append(f"{dead} dead letter(s) in the outbox: `flowx outbox dead-letters`")
    return {"pending": pending, "dead_letters": dead}


async def _retention(stores: Stores, settings: HostSettings) -> dict[str, Any]:
    report = await sweep(
        stores,
        now=datetime.now(UTC),
        archiver=None,
        page_size=settings.retention_page_size,
        dry_run=True,
    )
    return {"would_delete": report.deleted, "held_back": dict(report.held_back)}


async def _versions(stores: Stores, plans: list[Plan], problems: list[str]) -> dict[str, Any]:
    live = await stores.catalog.count_instances(InstanceQuery(unfinished=True), by="version")
    carried = {p.ref for p in plans}
    doc: dict[str, Any] = {
        ref: {"unfinished": n, "carried": (ref in carried) if plans else None}
        for ref, n in live.items()
    }
    missing = [ref for ref, n in live.items() if plans and ref not in carried]
    if missing:
        problems.append(
            "unfinished instances of flow versions the given --flows do not carry: "
            + ", ".join(f"{ref} ({live[ref]})" for ref in missing)
            + "; keep a worker with that code until they drain"
        )
    return doc


async def _examine_or_behind(db: str, plans: list[Plan], settings: HostSettings) -> dict[str, Any]:
    """``examine``, or — for a journal at an older schema, which this code cannot read — that
    one problem, with the migration to run, and the settings."""
    try:
        return await examine(db, plans, settings)
    except SchemaNotMigrated as exc:
        return {"problems": [str(exc)], "settings": settings.resolved(), "behind": True}


def _text(doc: dict[str, Any]) -> str:
    if doc.get("behind"):
        problems = [f"problem    {p}" for p in doc["problems"]]
        settings = ", ".join(f"{k}={v}" for k, v in sorted(doc["settings"].items()))
        return "\n".join([*problems, f"settings   {settings}"])
    store, clock, outbox = doc["store"], doc["clock"], doc["outbox"]
    lines = [
        f"store      {store['describe']} (schema {store['schema_version']})",
        f"clock      offset {clock['offset_s']}s"
        + (f" (limit {clock['limit_s']}s)" if "limit_s" in clock else ""),
        "instances  "
        + (", ".join(f"{n} {state}" for state, n in doc["instances"].items()) or "none"),
        f"stuck      {doc['stuck']['count']}{'+' if doc['stuck']['at_least'] else ''}",
        f"outbox     {outbox['pending']} pending, {outbox['dead_letters']} dead letter(s)",
        f"retention  would delete {doc['retention']['would_delete']}, holds back "
        + (", ".join(f"{n} ({why})" for why, n in doc["retention"]["held_back"].items()) or "none"),
        "versions   "
        + (
            ", ".join(
                f"{ref}: {v['unfinished']} unfinished"
                + ("" if v["carried"] is None else "" if v["carried"] else " NOT CARRIED")
                for ref, v in doc["versions"].items()
            )
            or "nothing in flight"
        ),
        "settings   " + ", ".join(f"{k}={v}" for k, v in sorted(doc["settings"].items())),
    ]
    lines += [f"problem    {p}" for p in doc["problems"]] or ["ok         nothing needs attention"]
    return "\n".join(lines)


@click.command()
@db_option
@optional_flows_option
@output_option
def doctor(db: str, flows: tuple[str, ...], output: str) -> None:
    """Check a journal and this machine's settings: connectivity, schema, clock offset,
    stuck instances, the outbox, retention, the flow versions in flight (with --flows:
    those it does not carry), and the settings as resolved here. Exits 1 if anything needs
    attention, 3 if there is no journal where --db points."""
    plans = plans_or_fail(flows) if flows else []
    settings = HostSettings.load()
    doc = run(_examine_or_behind(db, plans, settings))
    doc["ok"] = not doc["problems"]
    if output == "json":
        emit_json(doc)
    else:
        click.echo(_text(doc))
    if doc["problems"]:
        raise SystemExit(EXIT_ERROR)
