"""``flowx retention``: how long ended instances are kept, and the sweep that deletes them
(R2.13). Policies change without a deploy: every sweep reads them afresh."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import click

from flowx.cli import inputs
from flowx.cli.app import db_option, leases_option, output_option
from flowx.cli.connect import command_host, open_stores
from flowx.cli.exits import fail, run
from flowx.cli.render import emit_json, table
from flowx.durations import parse_duration
from flowx.errors import RequestInvalid
from flowx.hosting.archive import JsonlArchiver
from flowx.hosting.retention import MAX_WINDOW, MIN_WINDOW, SweepReport
from flowx.hosting.stores import from_url
from flowx.stores.records import RETENTION_CLASSES, RetentionPolicy


@click.group()
def retention() -> None:
    """How long ended instances are kept, and the sweep that deletes them (R2.13)."""


def _window(policy: RetentionPolicy) -> str:
    if policy.retain_for is None:
        return "never deleted"
    days, rest = divmod(int(policy.retain_for.total_seconds()), 86_400)
    return f"{days}d" if not rest else str(policy.retain_for)


def _policy_dict(policy: RetentionPolicy) -> dict[str, Any]:
    keep = policy.retain_for
    return {
        "flow_id": policy.flow_id,
        "state_class": policy.state_class,
        "retain_for_seconds": int(keep.total_seconds()) if keep is not None else None,
    }


@retention.command("show")
@db_option
@output_option
def show(db: str, output: str) -> None:
    """The retention policies: per flow, with '*' the default for every other flow.
    Failed covers every end but Completed (Failed, TimedOut, CompensationFailed, Cancelled,
    Terminated); Suspended instances are never swept."""

    async def main() -> list[RetentionPolicy]:
        async with open_stores(db, create=False) as stores:
            return list(await stores.retention.policies())

    policies = run(main())
    if output == "json":
        emit_json([_policy_dict(p) for p in policies])
        return
    rows = [(p.flow_id, p.state_class, _window(p)) for p in policies]
    click.echo(table(["flow", "class", "kept for"], rows))


def _keep(text: str) -> timedelta | None:
    if text.strip().lower() == "never":
        return None
    try:
        window = parse_duration(text, what="--keep")
    except ValueError as exc:
        raise RequestInvalid(f"{exc}; write e.g. 30d, 12h or never") from exc
    if not MIN_WINDOW <= window <= MAX_WINDOW:
        raise RequestInvalid(
            f"--keep {text!r} is outside 1 minute to 3650 days; write e.g. 30d, or never"
        )
    return window


@retention.command("set")
@click.option("--flow", "flow_id", default="*", show_default=True, help="A flow id, or '*'.")
@click.option(
    "--class",
    "state_class",
    type=click.Choice([c for c in RETENTION_CLASSES if c != "Suspended"]),
    required=True,
    help="Completed, Failed (every other end) or OutboxPublished.",
)
@click.option("--keep", required=True, help="How long: 30d, 12h, 90m ... or never.")
@db_option
@output_option
def set_(flow_id: str, state_class: str, keep: str, db: str, output: str) -> None:
    """Set how long instances of a flow ending in a class are kept. Takes effect at the next
    sweep, on every node."""
    if flow_id != "*":
        inputs.name_or_fail(flow_id, "--flow")
    if state_class == "OutboxPublished" and flow_id != "*":
        fail(RequestInvalid("published events are kept per journal, not per flow: --flow '*'"))
    try:
        window = _keep(keep)
    except RequestInvalid as exc:
        fail(exc)
    policy = RetentionPolicy(flow_id=flow_id, state_class=state_class, retain_for=window)

    async def main() -> None:
        async with open_stores(db) as stores:
            await stores.retention.set_policy(policy)

    run(main())
    if output == "json":
        emit_json(_policy_dict(policy))
    else:
        click.echo(f"{flow_id} {state_class}: {_window(policy)} (from the next sweep)")


def report_dict(report: SweepReport) -> dict[str, Any]:
    return {
        "dry_run": report.dry_run,
        "busy": report.busy,
        "deleted": report.deleted,
        "archived": report.archived,
        "held_back": report.held,
        "held_back_by": dict(report.held_back),
        "outbox_deleted": report.outbox_deleted,
        "outbox_held_back": report.outbox_held_back,
    }


@retention.command("sweep")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option(
    "--archive-dir",
    default=None,
    help="Write each page to a .jsonl.gz file here before deleting it.",
)
@db_option
@leases_option
@output_option
def sweep(dry_run: bool, archive_dir: str | None, db: str, leases: str | None, output: str) -> None:
    """Delete now what is past its retention window, as workers do every hour. One node
    sweeps at a time: if one is sweeping, this says so and does nothing. An instance that
    still owes an event to a publisher or a declared consumer, or whose parent has not
    ended, is kept and counted."""
    archiver = JsonlArchiver(archive_dir) if archive_dir else None

    async def main() -> SweepReport:
        stores = from_url(db, leases=leases)
        try:
            async with command_host(stores, [], archiver=archiver) as host:
                return await host.sweep_retention(dry_run=dry_run)
        finally:
            await stores.close()

    doc = report_dict(run(main()))
    if output == "json":
        emit_json(doc)
        return
    if doc["busy"]:
        click.echo("another node is sweeping right now; nothing done")
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{verb} {doc['deleted']} instance(s); kept {doc['held_back']} past their window")
    for why, count in doc["held_back_by"].items():
        click.echo(f"  {count} kept: {why}")
    if not dry_run:
        click.echo(
            f"archived {doc['archived']}; deleted {doc['outbox_deleted']} published event(s)"
        )
