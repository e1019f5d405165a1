"""``flowx worker``: run a node until it is told to stop."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from flowx.cli.app import db_option, flows_option, leases_option
from flowx.cli.exits import fail, run
from flowx.errors import FlowXError
from flowx.hosting.settings import HostSettings
from flowx.hosting.worker import configure_logging, load_flows, serve


@click.command()
@db_option
@leases_option
@flows_option
@click.option("--node-id", default=None, help="Name of this node in leases and logs.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error", "critical"], case_sensitive=False),
    default="info",
    show_default=True,
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the node id here once the worker is ready (for supervisors and tests).",
)
@click.option("--lease-ttl", default=None, help="e.g. 30s (also FLOWX_LEASE_TTL).")
@click.option(
    "--recovery-scan-interval", default=None, help="e.g. 10s (also FLOWX_RECOVERY_SCAN_INTERVAL)."
)
@click.option(
    "--shutdown-drain-timeout", default=None, help="e.g. 30s (also FLOWX_SHUTDOWN_DRAIN_TIMEOUT)."
)
@click.option(
    "--publish",
    "publish_url",
    envvar="FLOWX_PUBLISH_URL",
    default=None,
    help="Drain the outbox to this broker: redis://…, amqp://… or nats://… (comma-separated "
    "for several); also FLOWX_PUBLISH_URL. Any number of workers may publish at once.",
)
def worker(
    db: str,
    leases: str | None,
    flows: tuple[str, ...],
    node_id: str | None,
    log_format: str,
    log_level: str,
    ready_file: Path | None,
    lease_ttl: str | None,
    recovery_scan_interval: str | None,
    shutdown_drain_timeout: str | None,
    publish_url: str | None,
) -> None:
    """Run a node: execute instances, renew leases, recover, drain on SIGTERM."""
    # Logging first, so every line the node logs — from importing --flows on — is already in
    # the format and at the level the supervisor collects.
    configure_logging(log_format, log_level)
    try:
        settings = HostSettings.load(
            lease_ttl=lease_ttl,
            recovery_scan_interval=recovery_scan_interval,
            shutdown_drain_timeout=shutdown_drain_timeout,
        )
        plans = load_flows(flows)
    except FlowXError as exc:
        fail(exc)
    code = run(
        serve(
            store_url=db,
            leases_url=leases,
            plans=plans,
            settings=settings,
            node_id=node_id,
            ready_file=ready_file,
            publish_url=publish_url,
            exit_watchdog=True,
        )
    )
    sys.exit(code)
