"""``flowx``: run a worker, start, list and inspect instances, migrate a store.

Exit codes are part of the interface, so scripts can branch without parsing messages:

* 0 — done;
* 1 — a FlowX error (bad input, bad store URL, a file that is not a journal, ...);
* 2 — a usage error (click's own: unknown option, bad ``--before`` cursor, ...; an argument,
  ``--input``, ``--input-file`` or ``--payload`` that is not UTF-8 JSON FlowX can read or
  store; a signal the flow never waits for, a payload of the wrong shape, a flow ``--flows``
  does not carry);
* 3 — not found: no such instance, or no such flow among ``--flows``;
* 4 — illegal state: the instance is in the wrong state for what was asked (a signal to an
  instance that has ended, a replay of one that is not stopped where ``--from`` says).

Every FlowX error is printed as one ``error: ...`` line on stderr saying what to do, never as a
traceback: an operator at a terminal needs the fix, not the call stack. Anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from flowx import codec
from flowx.cli import inputs
from flowx.cli.output import clip, emit_json, table
from flowx.errors import DeadLetterNotFound, FlowNotFound, FlowXError, InstanceNotFound
from flowx.hosting.host import FlowHost
from flowx.hosting.replay import ReplayPlan
from flowx.hosting.settings import HostSettings
from flowx.hosting.storable import INPUT_UNSTORABLE, SIGNAL_UNSTORABLE
from flowx.hosting.stores import DEFAULT_URL, from_url
from flowx.hosting.worker import configure_logging, load_flows, serve
from flowx.plan.model import Plan, walk
from flowx.stores.errors import UnknownInstance
from flowx.stores.protocols import InstanceQuery, Stores
from flowx.stores.records import (
    CHILD_WAIT,
    EventRecord,
    InstanceRecord,
    InstanceState,
    SignalReceipt,
    StepRecord,
)

T = TypeVar("T")

EXIT_ERROR = 1
#: click's own code for a usage error; also a FlowX error that says the request was malformed.
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
#: A command that acts on an instance (signal, replay) found it in the wrong state.
EXIT_ILLEGAL_STATE = 4

#: FlowX error codes that mean "the instance is not in a state where that can be done".
_ILLEGAL_STATE_CODES = frozenset({"instance.illegal_state", "instance.finished"})
#: FlowX error codes that mean "what was asked is malformed": fix the command line. A value
#: the journal cannot store (R9.5) is one: nothing was written, and the same value never will be.
_USAGE_CODES = frozenset(
    {
        "signal.unknown",
        "signal.payload_invalid",
        "cli.flow_not_carried",
        inputs.INPUT_UNREADABLE,
        INPUT_UNSTORABLE,
        SIGNAL_UNSTORABLE,
    }
)

_NOT_FOUND: tuple[type[FlowXError], ...] = (
    InstanceNotFound,
    UnknownInstance,
    FlowNotFound,
    DeadLetterNotFound,
)

db_option = click.option(
    "--db",
    "--dsn",
    "db",
    envvar="FLOWX_DATABASE_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Store URL: sqlite:///path.db or postgresql://...; also FLOWX_DATABASE_URL.",
)
leases_option = click.option(
    "--leases",
    "leases",
    envvar="FLOWX_LEASES_URL",
    default=None,
    help="Take leases from Redis (redis://host:6379/0) instead of the store; also "
    "FLOWX_LEASES_URL. Every worker and tool on one journal must name the same one.",
)


def output_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``-o text|json``, with ``--json`` as the short way to say ``-o json``.

    Both options write the one ``output`` parameter, so a command sees a single value.
    """
    fn = click.option("--json", "output", flag_value="json", help="Same as -o json.")(fn)
    return click.option(
        "-o",
        "--output",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        help="text for people, json (one document) for scripts.",
    )(fn)


flows_option = click.option(
    "--flows",
    "flows",
    multiple=True,
    required=True,
    metavar="MODULE:ATTR",
    help="Where the flow plans are, e.g. myapp.flows:FLOWS. Repeatable.",
)


# -- plumbing -------------------------------------------------------------------------------


def exit_code(exc: FlowXError) -> int:
    """The exit code for a FlowX error: 3 when something named does not exist, 4 when the
    instance is in the wrong state, 2 when the request itself is malformed, else 1."""
    if isinstance(exc, _NOT_FOUND):
        return EXIT_NOT_FOUND
    if exc.code in _ILLEGAL_STATE_CODES:
        return EXIT_ILLEGAL_STATE
    if exc.code in _USAGE_CODES:
        return EXIT_USAGE
    return EXIT_ERROR


def fail(exc: FlowXError) -> NoReturn:
    """Print ``exc`` as one line on stderr and exit with its code."""
    # A message may quote what was given, lone surrogates included: escape them, or
    # printing the error would itself fail with a UnicodeEncodeError.
    click.echo(f"error: {codec.printable(str(exc))}", err=True)
    sys.exit(exit_code(exc))


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine to completion, turning a FlowX error into a line and an exit code.

    Each command is one ``asyncio.run``: the stores' threads and the event loop live exactly as
    long as the command does.
    """
    try:
        return asyncio.run(coro)
    except FlowXError as exc:
        fail(exc)


@asynccontextmanager
async def open_stores(url: str) -> AsyncIterator[Stores]:
    """Open (and so migrate) the stores a URL names, and always close them.

    ``close`` runs even when ``open`` fails — on a file that is not a journal, say — so the
    store's database thread never outlives the command.
    """
    stores = from_url(url)
    try:
        await stores.open()
        yield stores
    finally:
        await stores.close()


def _payload(text: str | None) -> Any:
    """Decode a stored JSON payload for ``-o json``, so scripts get values, not strings."""
    return codec.loads(text) if text else None


def instance_dict(r: InstanceRecord) -> dict[str, Any]:
    """An instance row as JSON, with its payloads decoded."""
    data = dataclasses.asdict(r)
    data["state"] = r.state.value
    for field in ("input", "state_bag", "error"):
        data[field] = _payload(data[field])
    return data


def step_dict(s: StepRecord) -> dict[str, Any]:
    """A step row as JSON, with its result decoded and in full."""
    data = dataclasses.asdict(s)
    data["outcome"] = s.outcome.value
    data["result"] = _payload(s.result)
    return data


def _stamp(moment: datetime, timespec: str = "seconds") -> str:
    return moment.isoformat(timespec=timespec)


# -- commands -------------------------------------------------------------------------------


@click.group(cls=inputs.TextArgsGroup)
@click.version_option(package_name="flowx")
def cli() -> None:
    """FlowX: durable flows. A crash loses nothing; a zombie writes nothing."""


@cli.command()
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


@cli.command()
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
) -> None:
    """Start an instance, left Pending for any worker to run.

    The command only journals the instance and exits; a ``flowx worker`` carrying the flow
    picks it up, so starting never depends on this process staying alive.
    """
    try:
        payload, value = inputs.input_text(input_json, input_file)
    except FlowXError as exc:
        fail(exc)

    async def main() -> tuple[str, bool]:
        stores = from_url(db, leases=leases)
        host = FlowHost(store=stores, flows=load_flows(flows), recovery=False)
        plan = host.plan(flow_id, version)
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
        codec.dumps(
            value, root="input", code=INPUT_UNSTORABLE, context=f"the start of {plan.ref}"
        )
        try:
            async with host:
                handle = await host.start(
                    plan, payload, idempotency_key=idempotency_key, run_here=False
                )
                return handle.instance_id, handle.created
        finally:
            await stores.close()  # idempotent; covers an open() that failed half-way

    instance_id, created = run(main())
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


@cli.command(name="list")
@db_option
@output_option
@click.option("--flow", "flow_id", default=None, help="Only instances of this flow id.")
@click.option(
    "--state",
    type=click.Choice([s.value for s in InstanceState], case_sensitive=False),
    default=None,
    help="Only instances in this state.",
)
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
    """List instances, newest first.

    Paged by keyset (created_at, instance id) rather than offset, so a page is stable while
    new instances keep arriving at the top.
    """
    cursor = inputs.cursor(before) if before else None
    query = InstanceQuery(
        limit=limit,
        flow_id=flow_id,
        state=InstanceState(state) if state else None,
        before=cursor,
    )

    async def main() -> list[InstanceRecord]:
        async with open_stores(db) as stores:
            return list(await stores.catalog.list_instances(query))

    rows = run(main())
    if output == "json":
        emit_json([instance_dict(r) for r in rows])
        return
    if not rows:
        click.echo("no instances" + (" before that cursor" if cursor else ""))
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
                    _stamp(r.created_at),
                    _stamp(r.updated_at),
                )
                for r in rows
            ],
        )
    )
    if len(rows) == limit:
        # A full page may or may not be the last; the cursor is exact (microseconds), unlike
        # the seconds shown in the table.
        last = rows[-1]
        click.echo(f"more: --before {last.created_at.isoformat()},{last.instance_id}", err=True)


def _step_names(plans: list[Plan], record: InstanceRecord) -> dict[int, str]:
    """Step id → name for the plan ``record`` runs, when one of ``plans`` is it."""
    for plan in plans:
        if (plan.flow_id, plan.version) == (record.flow_id, record.flow_version):
            return {n.step_id: n.name for n in walk(plan.body)}
    return {}


def waiting_dict(
    record: InstanceRecord, steps: list[StepRecord], names: dict[int, str]
) -> dict[str, Any] | None:
    """What a Suspended instance waits for, or ``None`` for any other state.

    The wait's step name comes from the plan when ``--flows`` carries it, else from a journaled
    row of that step; a wait that has not committed anything is named only by its id.
    """
    if record.state is not InstanceState.SUSPENDED:
        return None
    step_id = record.wake_step_id
    name = None
    if step_id is not None:
        name = names.get(step_id) or next(
            (s.step_name for s in steps if s.step_id == step_id), None
        )
    child = record.wake_signal == CHILD_WAIT
    return {
        "kind": "sub_flow" if child else ("signal" if record.wake_signal else "timer"),
        "signal": None if child else record.wake_signal,
        "wake_at": record.wake_at.isoformat() if record.wake_at else None,
        "step_id": step_id,
        "step": name,
        "scope": record.wake_scope,
    }


def parent_dict(record: InstanceRecord) -> dict[str, Any] | None:
    """The parent of a child instance (the sub-flow step that started it), else ``None``."""
    if record.parent_instance_id is None:
        return None
    return {
        "instance_id": record.parent_instance_id,
        "scope": record.parent_scope,
        "step_id": record.parent_step_id,
    }


def _waits_for(waiting: dict[str, Any]) -> str:
    if waiting["kind"] == "sub_flow":
        return "sub-flow child (woken when the child instance ends)"
    if waiting["kind"] == "signal":
        return f"signal {waiting['signal']!r} (deliver it with `flowx signal`)"
    return "timer"


@cli.command()
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
    try:
        plans = load_flows(flows) if flows else []
    except FlowXError as exc:
        fail(exc)

    async def main() -> tuple[InstanceRecord, list[StepRecord]]:
        async with open_stores(db) as stores:
            record = await stores.journal.get(instance_id)
            if record is None:
                raise InstanceNotFound(instance_id)
            return record, list(await stores.journal.steps(instance_id))

    record, steps = run(main())
    waiting = waiting_dict(record, steps, _step_names(plans, record))
    parent = parent_dict(record)
    if output == "json":
        emit_json(
            {
                "instance": instance_dict(record),
                "steps": [step_dict(s) for s in steps],
                "waiting": waiting,
                "parent": parent,
            }
        )
        return
    facts: list[tuple[str, object]] = [
        ("instance", record.instance_id),
        ("flow", f"{record.flow_id}@{record.flow_version}"),
        ("state", record.state.value),
        ("tenant", record.tenant_id or "-"),
        ("fence", record.fence),
        ("created", _stamp(record.created_at, "milliseconds")),
        ("updated", _stamp(record.updated_at, "milliseconds")),
    ]
    if parent is not None:
        facts.append(
            (
                "parent",
                f"{parent['instance_id']} (step {parent['step_id']}, "
                f"scope {parent['scope'] or '-'})",
            )
        )
    if waiting is not None:
        facts.append(("waits for", _waits_for(waiting)))
        facts.append(("wake at", waiting["wake_at"] or "- (no timeout)"))
        step = f"#{waiting['step_id']}" if waiting["step_id"] is not None else "-"
        if waiting["step"]:
            step = f"{waiting['step']!r} ({step})"
        facts.append(("wait step", f"{step}, scope {waiting['scope'] or '-'}"))
    if record.resume_from_step is not None:
        facts.append(("replayed", f"from step #{record.resume_from_step}"))
    if record.error:
        facts.append(("error", record.error))
    facts.append(("state bag", record.state_bag))
    width = max(len(k) for k, _ in facts)
    for key, value in facts:
        click.echo(f"{key:<{width}}  {value}")
    click.echo()
    if not steps:
        click.echo("no steps committed yet")
        return
    click.echo(
        table(
            [
                "sequence",
                "scope",
                "step_id",
                "step",
                "attempt",
                "outcome",
                "capability",
                "duration_ms",
                "committed_at",
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
                    _stamp(s.committed_at, "milliseconds"),
                    clip(s.result),
                )
                for s in steps
            ],
        )
    )


# -- acting on an instance: signal, replay ---------------------------------------------------


def _cli_host(stores: Stores, plans: list[Plan]) -> FlowHost:
    """A host for one command: no recovery scan and no timers, so it runs nothing it was not
    asked to; on exit it drains and hands back whatever it holds."""
    return FlowHost(store=stores, flows=plans, recovery=False, timers=False)


def _not_carried(exc: FlowNotFound, flows: tuple[str, ...], plans: list[Plan]) -> FlowXError:
    """``--flows`` lacks the instance's flow: a command-line mistake, so a usage error."""
    what = f"{exc.flow_id}@{exc.version}" if exc.version else exc.flow_id
    carried = ", ".join(sorted(p.ref for p in plans)) or "none"
    return FlowXError(
        f"the instance runs flow {what!r}, which --flows {' '.join(flows)} does not define "
        f"(it defines: {carried}); pass the module that defines it, e.g. "
        "--flows myapp.flows:FLOWS (repeatable)",
        code="cli.flow_not_carried",
    )


def _load(flows: tuple[str, ...]) -> list[Plan]:
    try:
        return list(load_flows(flows))
    except FlowXError as exc:
        fail(exc)


def receipt_dict(r: SignalReceipt) -> dict[str, Any]:
    return {
        "instance_id": r.instance_id,
        "name": r.name,
        "seq": r.seq,
        "status": r.status,
        "state": r.state.value,
    }


@cli.command()
@click.argument("instance_id")
@click.argument("name")
@click.option(
    "--payload",
    default="{}",
    show_default=True,
    help="The signal's payload as JSON, checked against the type the flow waits for.",
)
@click.option(
    "--key", default=None, help="Deduplication key: a second signal with this key is inert."
)
@flows_option
@db_option
@leases_option
@output_option
def signal(
    instance_id: str,
    name: str,
    payload: str,
    key: str | None,
    flows: tuple[str, ...],
    db: str,
    leases: str | None,
    output: str,
) -> None:
    """Deliver the signal NAME to an instance.

    The signal is kept in the instance's inbox; if the instance is Suspended waiting for it,
    it is woken — left Pending for any worker to run, not run here. A --key already delivered
    is a duplicate (exit 0), even once the instance has ended. Exits 3 if there is no such
    instance, 4 if it has already ended, 2 if the flow never waits for NAME, the payload does
    not fit, or --flows does not carry the flow.
    """
    try:
        payload, value = inputs.payload_text(payload)
    except FlowXError as exc:
        fail(exc)
    plans = _load(flows)

    async def main() -> SignalReceipt:
        stores = from_url(db, leases=leases)
        try:
            async with _cli_host(stores, plans) as host:
                try:
                    return await host.signal(instance_id, name, payload, key=key, run_here=False)
                except FlowNotFound as exc:
                    raise _not_carried(exc, flows, plans) from exc
                except FlowXError as exc:
                    if exc.code != "signal.payload_invalid":
                        raise
                    # pydantic reports a lone surrogate's \\u escape as malformed JSON; say what
                    # is really wrong, as the host says it of a payload given as a value.
                    record = await host.get(instance_id)
                    ref = host.plan(record.flow_id, record.flow_version).ref
                    codec.dumps(
                        value,
                        root="payload",
                        code=SIGNAL_UNSTORABLE,
                        context=f"signal {name!r} for {ref}",
                    )
                    raise FlowXError(
                        f"{exc}; pass --payload as a JSON object of that shape",
                        code=exc.code,
                    ) from exc
        finally:
            await stores.close()

    receipt = run(main())
    if output == "json":
        emit_json(receipt_dict(receipt))
        return
    what = {
        "woken": "left Pending for a worker",
        "kept": "kept in the inbox until the flow reaches its wait",
        "duplicate": "already received (or the wait already took one); nothing written",
        "late": "the wait for it has already timed out; nothing written",
    }.get(receipt.status, "")
    click.echo(
        f"{receipt.status}: signal {receipt.name!r} #{receipt.seq} for {receipt.instance_id} "
        f"(state {receipt.state.value})" + (f"; {what}" if what else "")
    )


def replay_dict(p: ReplayPlan) -> dict[str, Any]:
    return {
        "instance_id": p.instance_id,
        "state": p.state.value,
        "mode": p.mode,
        "step": p.step,
        "step_id": p.step_id,
        "scope": p.scope,
        "reruns": list(p.reruns),
    }


def _replay_ok(mode: str, state: InstanceState) -> bool:
    """Whether a replay that ended in ``state`` did what it was for."""
    if state is InstanceState.COMPENSATION_FAILED:
        return False
    # Forward, Failed again means the step still fails; compensating, Failed is the goal.
    return not (mode == "forward" and state in (InstanceState.FAILED, InstanceState.TIMED_OUT))


@cli.command()
@click.option("--instance", "instance_id", required=True, help="The instance to replay.")
@click.option(
    "--from",
    "from_step",
    required=True,
    metavar="STEP",
    help="The step where the instance stopped (its name, or its numeric step id).",
)
@click.option("--dry-run", is_flag=True, help="Only say what would re-run; write nothing.")
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Run the instance here to its end (--wait) or leave it Pending for a worker.",
)
@flows_option
@db_option
@leases_option
@output_option
def replay(
    instance_id: str,
    from_step: str,
    dry_run: bool,
    wait: bool,
    flows: tuple[str, ...],
    db: str,
    leases: str | None,
    output: str,
) -> None:
    """Re-run a failed instance once its fault is fixed, never rewriting its history.

    CompensationFailed: the compensations still owed re-run, from the one that ran out.
    Failed with no compensation begun: the failed step re-runs and the flow goes on. Every
    try is a new attempt row. Exits 4 when the instance cannot be replayed (or --from is not
    where it stopped: the message names the right step), 3 if there is no such instance, and
    1 when a --wait replay ends CompensationFailed again or, forward, Failed again.
    """
    plans = _load(flows)
    # isdigit() is true of '²' too, which int() refuses: only ASCII digits are a step id.
    numeric = from_step.isascii() and from_step.isdigit()
    target: str | int = int(from_step) if numeric else from_step

    async def main() -> tuple[ReplayPlan, InstanceRecord | None]:
        stores = from_url(db, leases=leases)
        try:
            if not wait or dry_run:
                # An unopened host journals the re-arm but runs nothing: the instance is left
                # Pending for a worker, however quickly the command exits.
                await stores.open()
                host = _cli_host(stores, plans)
                try:
                    return await host.replay(instance_id, target, dry_run=dry_run), None
                except FlowNotFound as exc:
                    raise _not_carried(exc, flows, plans) from exc
            async with _cli_host(stores, plans) as host:
                try:
                    planned = await host.replay(instance_id, target)
                except FlowNotFound as exc:
                    raise _not_carried(exc, flows, plans) from exc
                await host.wait_idle()
                return planned, await host.get(instance_id)
        finally:
            await stores.close()

    planned, final = run(main())
    ok = final is None or _replay_ok(planned.mode, final.state)
    if output == "json":
        data = replay_dict(planned)
        data["dry_run"] = dry_run
        data["final_state"] = final.state.value if final is not None else None
        data["error"] = _payload(final.error) if final is not None else None
        emit_json(data)
    else:
        scope = f", scope {planned.scope}" if planned.scope else ""
        head = "would replay" if dry_run else "replayed"
        click.echo(
            f"{head} {planned.instance_id} ({planned.state.value}) in {planned.mode} mode "
            f"from {planned.step!r} (step #{planned.step_id}{scope})"
        )
        click.echo("re-runs:" if planned.reruns else "re-runs: nothing")
        for item in planned.reruns:
            click.echo(f"  {item}")
        if dry_run:
            click.echo("dry run: nothing was written")
        elif final is None:
            click.echo("left Pending for a worker (--no-wait)")
        else:
            click.echo(f"final state: {final.state.value}")
    if not ok:
        assert final is not None
        click.echo(
            f"error: the replay of {planned.instance_id} ended {final.state.value} again: "
            f"{final.error}; fix the fault and replay again (`flowx show` has every attempt)",
            err=True,
        )
        sys.exit(EXIT_ERROR)


@cli.command()
@db_option
@output_option
def migrate(db: str, output: str) -> None:
    """Bring a store's schema up to date (refusing one newer than this FlowX).

    Every command migrates on open; this one exists so a deployment can migrate once, before
    any worker starts, and fail loudly there rather than in the first worker.
    """

    async def main() -> tuple[str, int | None]:
        async with open_stores(db) as stores:
            return stores.describe(), await stores.schema_version()

    description, version = run(main())
    if output == "json":
        emit_json({"store": description, "schema_version": version})
    elif version is None:
        click.echo(f"{description}: schema up to date")
    else:
        click.echo(f"{description}: schema up to date (version {version})")


@cli.group()
def outbox() -> None:
    """The transactional outbox: what waits to be published, and dead letters (R5.5)."""


def event_dict(e: EventRecord) -> dict[str, Any]:
    return {
        "event_id": e.event_id,
        "instance_id": e.instance_id,
        "type": e.type,
        "schema_version": e.schema_version,
        "partition_key": e.partition_key,
        "staged_seq": e.staged_seq,
        "staged_at": e.staged_at.isoformat() if e.staged_at else None,
        "attempts": e.attempts,
        "dead_at": e.dead_at.isoformat() if e.dead_at else None,
        "reason": e.dead_reason,
        "payload": _payload(e.payload),
    }


@outbox.command("dead-letters")
@db_option
@output_option
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
def dead_letters(db: str, output: str, limit: int) -> None:
    """List events a broker refused for good, oldest first, with the broker's reason."""

    async def main() -> tuple[int, list[EventRecord]]:
        async with open_stores(db) as stores:
            return await stores.outbox.pending_count(), list(
                await stores.outbox.dead_letters(limit=limit)
            )

    pending, dead = run(main())
    if output == "json":
        emit_json({"pending": pending, "dead_letters": [event_dict(e) for e in dead]})
        return
    if not dead:
        click.echo(f"no dead letters ({pending} event(s) pending)")
        return
    click.echo(
        table(
            ["event_id", "type", "key", "attempts", "dead_at", "reason"],
            [
                (
                    e.event_id,
                    e.type,
                    e.partition_key or "-",
                    e.attempts,
                    _stamp(e.dead_at) if e.dead_at else "-",
                    clip(e.dead_reason or ""),
                )
                for e in dead
            ],
        )
    )
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


def main() -> None:
    """The console-script entry point (``flowx = "flowx.cli.main:main"``)."""
    cli(prog_name="flowx")


if __name__ == "__main__":
    main()
