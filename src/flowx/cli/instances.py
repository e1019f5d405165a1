"""``flowx start``, ``flowx list`` and ``flowx show``: create instances and look at them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from flowx import codec
from flowx.cli import inputs
from flowx.cli.app import db_option, flows_option, leases_option, output_option
from flowx.cli.connect import open_stores, plans_or_fail
from flowx.cli.exits import fail, run
from flowx.cli.render import (
    emit_json,
    instance_dict,
    instances_text,
    show_text,
    step_dict,
    table,
)
from flowx.cli.results import await_end, print_result
from flowx.errors import FlowXError, InputUnstorable, InstanceNotFound, SerialisationError
from flowx.hosting.documents import instance_view, next_cursor
from flowx.hosting.host import FlowHost
from flowx.hosting.settings import HostSettings
from flowx.hosting.stores import from_url
from flowx.hosting.worker import load_flows
from flowx.plan.model import Plan
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import ArchivedInstance, InstanceRecord, InstanceState


def _refuse_unstartable(plan: Plan, value: object) -> None:
    """What ``flowx start`` refuses before a host is asked: a flow with no journal, and an
    input the journal cannot store."""
    if not plan.durable:
        # An Ephemeral flow would run inside this command and vanish with it: the id printed
        # would name nothing any worker or `flowx show` could find.
        raise FlowXError(
            f"{plan.ref} is Ephemeral, so it has no journal a worker could run it from; "
            "start it in-process with FlowHost.start, or declare it Durable",
            code="cli.ephemeral_flow",
        )
    # A value the journal cannot store (a lone surrogate written as a \\u escape, NaN) is
    # refused as the host refuses it, before pydantic's JSON parser reports it as
    # malformed JSON.
    try:
        codec.dumps(value, root="input", context=f"the start of {plan.ref}")
    except SerialisationError as exc:
        raise InputUnstorable(str(exc), path=exc.path) from exc


@click.command()
@click.argument("flow_id")
@db_option
@leases_option
@flows_option
@output_option
@click.option("--version", "version", default=None, help="Flow version (default: highest).")
@click.option("--input", "input_json", default=None, help="The input as JSON (default: {}).")
@click.option(
    "--input-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Read the input JSON from this file.",
)
@click.option(
    "--idempotency-key", default=None, help="A repeated key returns the instance it started first."
)
@click.option(
    "--wait",
    type=click.FloatRange(0, 86_400),
    default=None,
    metavar="SECONDS",
    help="Then wait up to this long for a worker to finish it, and print what it ended with.",
)
def start(
    flow_id: str,
    db: str,
    leases: str | None,
    flows: tuple[str, ...],
    output: str,
    version: str | None,
    input_json: str | None,
    input_file: Path | None,
    idempotency_key: str | None,
    wait: float | None,
) -> None:
    """Start an instance, left Pending for any worker to run.

    The command only journals the instance and exits; a ``flowx worker`` carrying the flow
    picks it up, so starting never depends on this process staying alive. With --wait it
    then waits for the instance to end and prints what it ended with, as ``flowx result``
    does (exit 1 if it did not complete, 4 if it had not ended in time).
    """
    try:
        payload, value = inputs.input_text(input_json, input_file)
    except FlowXError as exc:
        fail(exc)

    async def main() -> tuple[str, bool]:
        stores = from_url(db, leases=leases)
        host = FlowHost(
            store=stores,
            flows=load_flows(flows),
            settings=HostSettings.load(recovery=False),
        )
        plan = host.plan(flow_id, version)
        _refuse_unstartable(plan, value)
        try:
            async with host:
                handle = await host.start(
                    plan, payload, idempotency_key=idempotency_key, run_here=False
                )
                return handle.instance_id, handle.created
        finally:
            await stores.close()  # idempotent; covers an open() that failed half-way

    instance_id, created = run(main())
    if wait is not None:
        print_result(run(await_end(db, instance_id, wait)), output)
        return
    if output == "json":
        emit_json({"instance_id": instance_id, "created": created})
        return
    # stdout carries only the id, so `id=$(flowx start ...)` works either way.
    click.echo(instance_id)
    if not created:
        click.echo(
            f"note: idempotency key {idempotency_key!r} already started this instance; "
            "nothing new was started",
            err=True,
        )


def _filters(fn: Any) -> Any:
    """The instance filters ``flowx list`` and ``flowx count`` share."""
    for option in reversed(
        [
            click.option("--flow", "flow_id", default=None, help="Only instances of this flow id."),
            click.option(
                "--state",
                type=click.Choice([s.value for s in InstanceState], case_sensitive=False),
                default=None,
                help="Only instances in this state.",
            ),
            click.option("--version", "flow_version", default=None, help="Only this flow version."),
            click.option("--tenant", default=None, help="Only this tenant's instances."),
            click.option("--parent", default=None, help="Only the sub-flows of this instance."),
            click.option("--since", default=None, help="Created at or after (ISO 8601, UTC)."),
            click.option("--until", default=None, help="Created before (ISO 8601, UTC)."),
        ]
    ):
        fn = option(fn)
    return fn


def _query(
    flow_id: str | None,
    state: str | None,
    flow_version: str | None,
    tenant: str | None,
    parent: str | None,
    since: str | None,
    until: str | None,
    **page: Any,
) -> InstanceQuery:
    for option, value in (
        ("--flow", flow_id),
        ("--version", flow_version),
        ("--tenant", tenant),
        ("--parent", parent),
    ):
        inputs.name_or_fail(value, option)
    return InstanceQuery(
        flow_id=flow_id,
        state=InstanceState(next(s for s in InstanceState if s.value.lower() == state.lower()))
        if state
        else None,
        flow_version=flow_version,
        tenant_id=tenant,
        parent_id=parent,
        since=inputs.moment(since, "--since") if since else None,
        until=inputs.moment(until, "--until") if until else None,
        **page,
    )


@click.command(name="list")
@db_option
@output_option
@_filters
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option(
    "--before",
    default=None,
    metavar="CREATED_AT,ID",
    help="Keyset cursor: the 'more:' line of the previous page (\"next\" in -o json).",
)
def list_(db: str, output: str, limit: int, before: str | None, **filters: Any) -> None:
    """List instances, newest first.

    Paged by keyset (created_at, instance id) rather than offset, so a page is stable while
    new instances keep arriving at the top. With -o json: {"instances": [...], "next":
    cursor or null}.
    """
    cursor = inputs.cursor(before) if before else None
    query = _query(**filters, limit=limit, before=cursor)

    async def main() -> list[InstanceRecord]:
        async with open_stores(db, create=False) as stores:
            return list(await stores.catalog.list_instances(query))

    rows = run(main())
    docs = [instance_dict(r) for r in rows]
    # A full page may or may not be the last; the cursor is exact (microseconds), unlike the
    # seconds shown in the table.
    more = next_cursor(rows, limit)
    if output == "json":
        emit_json({"instances": docs, "next": more})
        return
    if not rows:
        click.echo("no instances" + (" before that cursor" if cursor else ""))
        return
    click.echo(instances_text(docs))
    if more is not None:
        click.echo(f"more: --before {more}", err=True)


@click.command()
@db_option
@output_option
@_filters
@click.option("--by", type=click.Choice(["state", "flow"]), default="state", show_default=True)
def count(db: str, output: str, by: str, **filters: Any) -> None:
    """Count instances by state or by flow, under the same filters as list."""
    query = _query(**filters)

    async def main() -> dict[str, int]:
        async with open_stores(db, create=False) as stores:
            return await stores.catalog.count_instances(query, by=by)

    counts = run(main())
    if output == "json":
        emit_json({"by": by, "counts": counts, "total": sum(counts.values())})
        return
    if not counts:
        click.echo("no instances")
        return
    click.echo(table([by, "instances"], sorted(counts.items())))
    click.echo(f"{sum(counts.values())} in all", err=True)


@click.command()
@click.argument("instance_id")
@db_option
@output_option
@click.option(
    "--flows",
    "flows",
    multiple=True,
    metavar="MODULE:ATTR",
    help="Optional: the flow plans, to name the step a Suspended instance waits at.",
)
def show(instance_id: str, db: str, output: str, flows: tuple[str, ...]) -> None:
    """Show an instance and its step history, in commit order.

    A Suspended instance also says what it waits for (a signal, a sub-flow child or a timer),
    until when, and at which step; a child instance names its parent.
    """
    plans = plans_or_fail(flows) if flows else []

    async def main() -> ArchivedInstance:
        async with open_stores(db, create=False) as stores:
            # Everything the journal holds of it, in one read (one snapshot on PostgreSQL).
            found = await stores.retention.contents([instance_id])
        if not found:
            raise InstanceNotFound(instance_id)
        return found[0]

    everything = run(main())
    record, steps = everything.instance, list(everything.steps)
    doc = {**instance_view(everything, plans), "steps": [step_dict(s) for s in steps]}
    if output == "json":
        emit_json(doc)
        return
    click.echo(show_text(doc, record, steps))
