"""``flowx``: run a worker, start, list and inspect instances, migrate a store.

Exit codes: 0 ok, 1 error, 2 usage, 3 not found, 4 illegal state. Every FlowX error is printed
as one line on stderr with what to do; no traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from flowx import codec
from flowx.cli.output import clip, emit_json, table
from flowx.errors import FlowNotFound, FlowXError, InstanceNotFound
from flowx.hosting.host import FlowHost
from flowx.hosting.settings import HostSettings
from flowx.hosting.stores import DEFAULT_URL, from_url
from flowx.hosting.worker import configure_logging, load_flows, serve
from flowx.stores.protocols import InstanceQuery, Stores
from flowx.stores.records import InstanceRecord, InstanceState
from flowx.stores.sqlite import SqliteStores

T = TypeVar("T")

EXIT_ERROR, EXIT_NOT_FOUND, EXIT_ILLEGAL_STATE = 1, 3, 4

db_option = click.option(
    "--db",
    "db",
    envvar="FLOWX_DATABASE_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Store URL (sqlite:///path.db); also FLOWX_DATABASE_URL.",
)
def output_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``-o text|json``, with ``--json`` as the short way to say ``-o json``."""
    fn = click.option("--json", "output", flag_value="json", help="Same as -o json.")(fn)
    return click.option(
        "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True
    )(fn)
flows_option = click.option(
    "--flows",
    "flows",
    multiple=True,
    required=True,
    metavar="MODULE:ATTR",
    help="Where the flow plans are, e.g. myapp.flows:FLOWS. Repeatable.",
)


def run(coro: Awaitable[T]) -> T:
    """Run a coroutine, turning FlowX errors into one line and an exit code."""
    try:
        return asyncio.run(coro)  # type: ignore[arg-type]
    except (InstanceNotFound, FlowNotFound) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_NOT_FOUND)
    except FlowXError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_ERROR)


def with_stores(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    @functools.wraps(fn)
    async def wrapper(db: str, *args: Any, **kwargs: Any) -> T:
        stores = from_url(db)
        await stores.open()
        try:
            return await fn(stores, *args, **kwargs)
        finally:
            await stores.close()

    return wrapper


def instance_dict(r: InstanceRecord) -> dict[str, Any]:
    data = dataclasses.asdict(r)
    data["state"] = r.state.value
    for field in ("input", "state_bag", "error"):
        text = data.pop(field)
        data[field] = codec.loads(text) if text else None
    return data


@click.group()
@click.version_option(package_name="flowx")
def cli() -> None:
    """FlowX: durable flows. A crash loses nothing; a zombie writes nothing."""


@cli.command()
@db_option
@flows_option
@click.option("--node-id", default=None, help="Name of this node in leases and logs.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text")
@click.option("--log-level", default="info", show_default=True)
@click.option(
    "--ready-file",
    type=click.Path(path_type=Path),
    default=None,
    help="Write the node id here once the worker is ready.",
)
@click.option("--lease-ttl", default=None, help="e.g. 30s (FLOWX_LEASE_TTL)")
@click.option("--recovery-scan-interval", default=None, help="e.g. 10s")
@click.option("--shutdown-drain-timeout", default=None, help="e.g. 30s")
def worker(
    db: str,
    flows: tuple[str, ...],
    node_id: str | None,
    log_format: str,
    log_level: str,
    ready_file: Path | None,
    lease_ttl: str | None,
    recovery_scan_interval: str | None,
    shutdown_drain_timeout: str | None,
) -> None:
    """Run a node: execute instances, renew leases, recover, drain on SIGTERM."""
    configure_logging(log_format, log_level)

    async def main() -> int:
        settings = HostSettings.load(
            lease_ttl=lease_ttl,
            recovery_scan_interval=recovery_scan_interval,
            shutdown_drain_timeout=shutdown_drain_timeout,
        )
        return await serve(
            store_url=db,
            plans=load_flows(flows),
            settings=settings,
            node_id=node_id,
            ready_file=ready_file,
        )

    sys.exit(run(main()))


@cli.command()
@click.argument("flow_id")
@db_option
@flows_option
@output_option
@click.option("--version", "version", default=None, help="Flow version (default: highest).")
@click.option("--input", "input_json", default=None, help="The input as JSON.")
@click.option("--input-file", type=click.Path(exists=True, path_type=Path), default=None)
@click.option(
    "--idempotency-key", default=None, help="A repeated key returns the instance it started first."
)
def start(
    flow_id: str,
    db: str,
    flows: tuple[str, ...],
    output: str,
    version: str | None,
    input_json: str | None,
    input_file: Path | None,
    idempotency_key: str | None,
) -> None:
    """Start an instance, left Pending for any worker to run."""
    if input_json is not None and input_file is not None:
        raise click.UsageError("give --input or --input-file, not both")
    payload = input_file.read_text() if input_file is not None else (input_json or "{}")

    async def main() -> tuple[str, bool]:
        host = FlowHost(store=from_url(db), flows=load_flows(flows), recovery=False)
        async with host:
            handle = await host.start(
                flow_id, payload, version=version, idempotency_key=idempotency_key, run_here=False
            )
            return handle.instance_id, handle.created

    instance_id, created = run(main())
    if output == "json":
        emit_json({"instance_id": instance_id, "created": created})
    else:
        click.echo(instance_id if created else f"{instance_id} (already started with this key)")


@cli.command(name="list")
@db_option
@output_option
@click.option("--flow", "flow_id", default=None)
@click.option("--state", type=click.Choice([s.value for s in InstanceState]), default=None)
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option(
    "--before",
    default=None,
    metavar="CREATED_AT,ID",
    help="Keyset cursor printed at the end of the previous page.",
)
def list_(
    db: str, output: str, flow_id: str | None, state: str | None, limit: int, before: str | None
) -> None:
    """List instances, newest first."""
    cursor: tuple[datetime, str] | None = None
    if before:
        stamp, _, iid = before.partition(",")
        try:
            cursor = (datetime.fromisoformat(stamp), iid)
        except ValueError as exc:
            raise click.UsageError(f"--before {before!r} is not CREATED_AT,ID") from exc

    @with_stores
    async def main(stores: Stores) -> list[InstanceRecord]:
        query = InstanceQuery(
            limit=limit,
            flow_id=flow_id,
            state=InstanceState(state) if state else None,
            before=cursor,
        )
        return list(await stores.catalog.list_instances(query))

    rows = run(main(db))
    if output == "json":
        emit_json([instance_dict(r) for r in rows])
        return
    click.echo(
        table(
            ["instance", "flow", "version", "state", "created", "updated"],
            [
                (
                    r.instance_id,
                    r.flow_id,
                    r.flow_version,
                    r.state.value,
                    r.created_at.isoformat(timespec="seconds"),
                    r.updated_at.isoformat(timespec="seconds"),
                )
                for r in rows
            ],
        )
    )
    if len(rows) == limit:
        last = rows[-1]
        click.echo(f"\nmore: --before {last.created_at.isoformat()},{last.instance_id}")


@cli.command()
@click.argument("instance_id")
@db_option
@output_option
def show(instance_id: str, db: str, output: str) -> None:
    """Show an instance and its step history."""

    @with_stores
    async def main(stores: Stores) -> tuple[InstanceRecord, list[Any]]:
        record = await stores.journal.get(instance_id)
        if record is None:
            raise InstanceNotFound(instance_id)
        return record, list(await stores.journal.steps(instance_id))

    record, steps = run(main(db))
    if output == "json":
        emit_json(
            {
                "instance": instance_dict(record),
                "steps": [
                    {
                        **dataclasses.asdict(s),
                        "outcome": s.outcome.value,
                        "result": codec.loads(s.result),
                    }
                    for s in steps
                ],
            }
        )
        return
    facts = [
        ("instance", record.instance_id),
        ("flow", f"{record.flow_id}@{record.flow_version}"),
        ("state", record.state.value),
        ("tenant", record.tenant_id or "-"),
        ("fence", record.fence),
        ("created", record.created_at.isoformat(timespec="milliseconds")),
        ("updated", record.updated_at.isoformat(timespec="milliseconds")),
        ("state bag", clip(record.state_bag, 100)),
    ]
    if record.error:
        facts.append(("error", clip(record.error, 200)))
    width = max(len(k) for k, _ in facts)
    for key, value in facts:
        click.echo(f"{key:<{width}}  {value}")
    click.echo()
    click.echo(
        table(
            [
                "seq",
                "scope",
                "step",
                "name",
                "attempt",
                "outcome",
                "capability",
                "ms",
                "committed",
                "result",
            ],
            [
                (
                    s.sequence,
                    s.scope or "-",
                    s.step_id,
                    s.step_name,
                    s.attempt,
                    s.outcome.value,
                    f"{s.capability_id}@{s.capability_version}" if s.capability_id else "-",
                    s.duration_ms,
                    s.committed_at.isoformat(timespec="milliseconds"),
                    clip(s.result),
                )
                for s in steps
            ],
        )
    )


@cli.command()
@db_option
@output_option
def migrate(db: str, output: str) -> None:
    """Bring a store's schema up to date (refusing one newer than this FlowX)."""

    @with_stores
    async def main(stores: Stores) -> int | None:
        if isinstance(stores, SqliteStores):
            return await stores.db.run(
                lambda conn: int(
                    conn.execute("SELECT max(version) FROM flowx_schema_migrations").fetchone()[0]
                )
            )
        return None

    version = run(main(db))
    if output == "json":
        emit_json({"store": db, "schema_version": version})
    else:
        click.echo(f"{db}: schema up to date (version {version})")


def main() -> None:
    cli(prog_name="flowx")


if __name__ == "__main__":
    main()
