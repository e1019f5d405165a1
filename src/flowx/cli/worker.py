"""``flowx worker``: run a node until it is told to stop."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from flowx.cli.app import db_option, flows_option, leases_option
from flowx.cli.exits import fail, run
from flowx.errors import FlowXError
from flowx.hosting.settings import HostSettings
from flowx.hosting.worker import configure_logging, load_flows, serve
from flowx.ingress.service import IngressService


def settings_options(fn: Any) -> Any:
    """One flag per ``HostSettings`` field (``--lease-ttl``, ``--no-recovery`` ...): every
    setting can be given on the command line, over ``FLOWX_*`` and ``[tool.flowx]``."""
    for name, field in reversed(list(HostSettings.model_fields.items())):
        flag = name.replace("_", "-")
        also = f"(also FLOWX_{name.upper()} or [tool.flowx] {name})"
        if field.annotation is bool:
            fn = click.option(f"--{flag}/--no-{flag}", name, default=None, help=also)(fn)
        else:
            fn = click.option(f"--{flag}", name, default=None, help=also)(fn)
    return fn


@click.command()
@db_option
@leases_option
@flows_option
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
@click.option(
    "--publish",
    "publish_url",
    envvar="FLOWX_PUBLISH_URL",
    default=None,
    help="Drain the outbox to this broker: redis://…, amqp://… or nats://… (comma-separated "
    "for several); also FLOWX_PUBLISH_URL. Any number of workers may publish at once.",
)
@click.option(
    "--ingress",
    "ingress_urls",
    envvar="FLOWX_INGRESS_URL",
    multiple=True,
    help="Take work from this broker queue: amqp://user:pass@host:5672/vhost?queue=orders "
    "(RabbitMQ) or nats://host:4222/<stream>/<consumer> (NATS JetStream); repeatable or "
    "comma-separated; also "
    "FLOWX_INGRESS_URL. Each message starts an instance or delivers a signal; poison goes "
    "to a dead-letter queue.",
)
@settings_options
def worker(
    db: str,
    leases: str | None,
    flows: tuple[str, ...],
    log_format: str,
    log_level: str,
    ready_file: Path | None,
    publish_url: str | None,
    ingress_urls: tuple[str, ...],
    **given: Any,
) -> None:
    """Run a node: execute instances, renew leases, recover, drain on SIGTERM.

    Every setting is also a flag (below), over FLOWX_* variables and [tool.flowx] in
    pyproject.toml; `flowx doctor` prints what they resolve to."""
    # Logging first, so every line the node logs — from importing --flows on — is already in
    # the format and at the level the supervisor collects.
    configure_logging(log_format, log_level)
    try:
        settings = HostSettings.load(**given)
        plans = load_flows(flows)
        services = [IngressService.from_urls(ingress_urls)] if ingress_urls else []
    except FlowXError as exc:
        fail(exc)
    code = run(
        serve(
            store_url=db,
            leases_url=leases,
            plans=plans,
            settings=settings,
            ready_file=ready_file,
            publish_url=publish_url,
            exit_watchdog=True,
            services=services,
        )
    )
    sys.exit(code)
