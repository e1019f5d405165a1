"""``flowx worker``: one node as an operating-system process.

It carries the flows it is given, executes instances, renews their leases, runs the recovery
scan, and on SIGTERM (or SIGINT) drains: no new work, in-flight steps finish within
``shutdown_drain_timeout``, every lease is released explicitly, exit 0 (R7.2). What still runs
when the budget ends — a hung capability included — is cut and left for recovery, and the
process always exits (``flowx.hosting.shutdown``). Several workers on one store are a cluster
with no other coordination (R1.1).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from flowx.errors import FlowsInvalid, FlowXError
from flowx.hosting.host import FlowHost
from flowx.hosting.settings import HostSettings
from flowx.hosting.shutdown import Signals, arm_exit_watchdog
from flowx.hosting.stores import from_url
from flowx.outbox.urls import publisher_from_url
from flowx.plan.model import Plan
from flowx.redaction import RedactingFilter, redact
from flowx.urls import BadURL

log = logging.getLogger("flowx.worker")


def load_flows(specs: Iterable[str]) -> list[Plan]:
    """Import ``module:attr`` specs; ``attr`` is a Plan, an iterable of Plans, or a function
    returning either."""
    plans: list[Plan] = []
    for spec in specs:
        module_name, _, attr = spec.partition(":")
        if not module_name or not attr or module_name.startswith("."):
            raise FlowsInvalid(f"--flows {spec!r} must be module:attribute, e.g. myapp.flows:FLOWS")
        if str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise FlowsInvalid(f"cannot import {module_name!r} for --flows: {exc}") from exc
        try:
            value: Any = getattr(module, attr)
        except AttributeError as exc:
            raise FlowsInvalid(f"{module_name} has no attribute {attr!r} for --flows") from exc
        if isinstance(value, type):  # a model or a class: calling it builds no plan
            raise FlowsInvalid(
                f"{spec} is the class {value.__name__}, not a plan, a list of plans or a "
                "function returning them"
            )
        if callable(value) and not isinstance(value, Plan):
            value = value()
        try:
            found = [value] if isinstance(value, Plan) else list(value)
        except TypeError as exc:  # a module, a number: not an iterable of plans
            raise FlowsInvalid(
                f"{spec} is a {type(value).__name__}, not a plan, a list of plans or a "
                "function returning them"
            ) from exc
        for plan in found:
            if not isinstance(plan, Plan):
                raise FlowsInvalid(f"{spec} yielded {plan!r}, which is not a built plan")
        plans.extend(found)
    if not plans:
        raise FlowsInvalid("--flows named no plans")
    return plans


#: What every ``LogRecord`` carries; anything else on a record came in ``extra=`` and is a
#: field of its own in JSON.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message"}
#: The libraries whose lines go through the same handler and format as FlowX's own.
LIBRARY_LOGGERS = ("psycopg", "redis", "aio_pika", "aiormq", "nats")


def _iso(record: logging.LogRecord) -> str:
    """The record's time as ISO 8601 in UTC, to the millisecond."""
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


class _TextFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _iso(record)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _iso(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(fmt: str, level: str) -> None:
    """Only the worker configures logging; importing flowx never does. FlowX's lines and the
    libraries' it drives (the psycopg pool's, the brokers') share one handler, one format
    and ISO 8601 UTC timestamps; the libraries at WARNING unless the level is lower."""
    handler = logging.StreamHandler()
    # Every line through this handler, a library's child loggers' included, has its secrets
    # redacted (R9.8): a driver may log the URL it was given.
    handler.addFilter(RedactingFilter())
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("flowx")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in LIBRARY_LOGGERS:
        library = logging.getLogger(name)
        library.handlers[:] = [handler]
        library.propagate = False
        # A library's INFO is its internals (a pool filling up): WARNING, unless asked for DEBUG.
        library.setLevel(logging.DEBUG if level.lower() == "debug" else logging.WARNING)


class WorkerService(Protocol):
    """Something a worker runs beside its node (the broker ingress, ``flowx.ingress``): started
    once the node is ready, stopped before the node drains, so it hands the node no new work
    while the node is stopping."""

    @property
    def name(self) -> str: ...

    async def start(self, host: FlowHost) -> None: ...

    async def stop(self, timeout: float) -> None: ...


async def serve(
    *,
    store_url: str,
    leases_url: str | None = None,
    plans: list[Plan],
    settings: HostSettings,
    node_id: str | None = None,
    ready_file: Path | None = None,
    publish_url: str | None = None,
    exit_watchdog: bool = False,
    services: Sequence[WorkerService] = (),
) -> int:
    """Run a node until SIGTERM/SIGINT, then drain. Returns the exit code.

    ``services`` (the ``--ingress`` consumers) start once the node is ready, before the
    ready file is written, and stop first on the drain, each within the drain budget.

    ``exit_watchdog`` (the ``flowx worker`` process sets it): once stopped, the process is
    ended shortly after if something (a non-daemon thread) would keep it alive."""
    publisher = publisher_from_url(publish_url) if publish_url else None
    if publisher is not None:
        # A broker that is down stops nothing (the host's loop retries it, SPEC §8), but a
        # URL it refuses (BadURL) stops the worker here, with one line, rather than every
        # publish round failing for ever.
        try:
            await publisher.open()
        except BadURL:
            raise
        except Exception as exc:
            shown = redact(repr(exc), secrets_of=(publish_url or "",), limit=None)
            log.debug("broker %s not reached before start-up: %s", publisher.name, shown)
    host = FlowHost(
        store=from_url(store_url, leases=leases_url),
        flows=plans,
        settings=settings if node_id is None else settings.replace(node_id=node_id),
        publisher=publisher,
    )
    stop = asyncio.Event()
    Signals(stop).install(asyncio.get_running_loop())
    await host.open()
    if not host.ready:
        log.info("worker %s waiting for the journal before it is ready", host.node_id)
    # Ready means the stores answer: a worker that came up while its journal is down reports
    # ready only once it has connected (it reconnects in the background meanwhile).
    ready_wait = asyncio.ensure_future(host.wait_ready())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({ready_wait, stopping}, return_when=asyncio.FIRST_COMPLETED)
    ready_wait.cancel()
    stopping.cancel()
    if stop.is_set():
        log.info("worker %s stopped before it was ready", host.node_id)
        await host.drain()
        return 0
    log.info(
        "worker %s ready on %s carrying %s",
        host.node_id,
        host.store.describe() if host.store else "-",
        ", ".join(p.ref for p in plans),
    )
    budget = settings.shutdown_drain_timeout.total_seconds()
    running: list[WorkerService] = []
    for service in services:
        try:
            await service.start(host)
        except BaseException:
            await _stop_services(running, budget)
            await host.drain()
            raise
        running.append(service)
    if ready_file is not None:
        try:
            ready_file.write_text(host.node_id)  # noqa: ASYNC240 - one tiny write at start-up
        except OSError as exc:  # a supervisor waits on this file: without it, stop at once
            await _stop_services(running, budget)
            await host.drain()
            raise FlowXError(
                f"cannot write --ready-file {str(ready_file)!r}: {exc.strerror or exc}",
                code="worker.bad_ready_file",
            ) from exc
    await stop.wait()
    log.info("worker %s draining (%d in flight)", host.node_id, host.in_flight)
    if ready_file is not None:
        ready_file.unlink(missing_ok=True)  # noqa: ASYNC240 - not ready any more, at once
    # No new work first, then the node drains: one budget for both (R9.3). The services get
    # half of it at most (a handle in flight is a start's commit), the node what is left.
    began = time.monotonic()
    await _stop_services(running, budget / 2 if running else 0.0)
    await host.drain(timeout=max(budget - (time.monotonic() - began), 0.0))
    if host.stuck_threads:
        log.warning(
            "worker %s: %d capability thread(s) still stuck; their instances were released "
            "for recovery",
            host.node_id,
            host.stuck_threads,
        )
    log.info("worker %s stopped", host.node_id)
    if exit_watchdog:
        arm_exit_watchdog(0)
    return 0


async def _stop_services(services: list[WorkerService], budget: float) -> None:
    """Stop ``services``, newest first; one that fails to stop cleanly is logged, not raised:
    the node must still drain and release its leases."""
    for service in reversed(services):
        try:
            await service.stop(budget)
        except Exception as exc:
            log.warning("stopping %s failed: %s", service.name, redact(repr(exc)))
