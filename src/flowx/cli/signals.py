"""``flowx signal`` and ``flowx replay``: act on one instance through a host that runs only
what it is asked to."""

from __future__ import annotations

import sys
from datetime import timedelta

import click

from flowx import codec
from flowx.cli import inputs
from flowx.cli.app import db_option, flows_option, leases_option, output_option
from flowx.cli.connect import command_host, not_carried, plans_or_fail
from flowx.cli.exits import EXIT_ERROR, fail, run
from flowx.cli.render import emit_json, receipt_dict, receipt_text, replay_dict, replay_text
from flowx.cli.render import payload as decoded
from flowx.durations import parse_duration
from flowx.engine.replay_plan import ReplayPlan
from flowx.errors import (
    FlowNotFound,
    FlowXError,
    RequestInvalid,
    SignalPayloadInvalid,
)
from flowx.hosting.correlation import resolve_correlation
from flowx.hosting.host import FlowHost
from flowx.hosting.storable import signal_payload
from flowx.hosting.stores import from_url
from flowx.stores.protocols import InstanceCatalog
from flowx.stores.records import InstanceRecord, InstanceState, SignalReceipt


async def _why_invalid(
    host: FlowHost, exc: FlowXError, instance_id: str, name: str, value: object
) -> FlowXError:
    """The error to report for a payload the flow's type refused.

    pydantic reports a lone surrogate's \\u escape as malformed JSON; say what is really wrong
    (``SignalPayloadUnstorable`` is raised), as the host says it of a payload given as a value.
    """
    record = await host.get(instance_id)
    plan = host.plan(record.flow_id, record.flow_version)
    with codec.sealing(host.sealing_for(instance_id)):  # sealed as the host would seal it
        signal_payload(plan, name, value, key=None)
    return SignalPayloadInvalid(f"{exc}; pass --payload as a JSON object of that shape")


@click.command()
@click.argument("instance_id", metavar="[INSTANCE_ID]")
@click.argument("name", required=False)
@click.option(
    "--correlation",
    default=None,
    metavar="ID",
    help="Name the instance by its correlation id instead: give only NAME then.",
)
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
    name: str | None,
    correlation: str | None,
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

    `flowx signal --correlation ID NAME` names the instance by the correlation id it was
    started with: the one instance with it that has not ended, else the newest that has;
    exits 3 if none has it, 2 if several that have not ended do.
    """
    if correlation is not None:
        if name is not None:
            fail(RequestInvalid("with --correlation give only the signal NAME, not an instance"))
        instance_id, name = "", instance_id
    elif name is None:
        fail(RequestInvalid("give INSTANCE_ID and NAME, or --correlation ID and NAME"))
    try:
        payload, value = inputs.payload_text(payload)
    except FlowXError as exc:
        fail(exc)
    plans = plans_or_fail(flows)
    signal_name: str = name

    async def main() -> SignalReceipt:
        nonlocal instance_id
        stores = from_url(db, leases=leases)
        try:
            async with command_host(stores, plans) as host:
                if correlation is not None:
                    instance_id = await resolve_correlation(host_catalog(host), correlation)
                try:
                    return await host.signal(
                        instance_id, signal_name, payload, key=key, run_here=False
                    )
                except FlowNotFound as exc:
                    raise not_carried(exc, flows, plans) from exc
                except FlowXError as exc:
                    if not isinstance(exc, SignalPayloadInvalid):
                        raise
                    raise await _why_invalid(host, exc, instance_id, signal_name, value) from exc
        finally:
            await stores.close()

    receipt = receipt_dict(run(main()))
    if output == "json":
        emit_json(receipt)
        return
    click.echo(receipt_text(receipt))


def host_catalog(host: FlowHost) -> InstanceCatalog:
    """The catalog of the store ``command_host`` opened (it always has one)."""
    store = host.store
    assert store is not None  # nosec B101  # command_host is built on stores
    return store.catalog


def _deadline(text: str | None) -> timedelta | None:
    """``--deadline``: a duration from now, or a usage error saying how to write one."""
    if text is None:
        return None
    try:
        return parse_duration(text, what="--deadline")
    except ValueError as exc:
        fail(RequestInvalid(f"{exc}; write e.g. 90s, 30m or 1h30m"))


def _replay_ok(mode: str, state: InstanceState) -> bool:
    """Whether a replay that ended in ``state`` did what it was for."""
    if state in (InstanceState.COMPENSATION_FAILED, InstanceState.QUARANTINED):
        return False
    # Forward, Failed again means the step still fails; compensating, Failed is the goal.
    return not (mode == "forward" and state in (InstanceState.FAILED, InstanceState.TIMED_OUT))


@click.command()
@click.option("--instance", "instance_id", required=True, help="The instance to replay.")
@click.option(
    "--from",
    "from_step",
    required=True,
    metavar="STEP",
    help="The step to re-run from (its name, or its numeric step id).",
)
@click.option(
    "--deadline",
    default=None,
    metavar="DURATION",
    help="A new deadline, from now (90s, 1h30m): needed to replay a TimedOut instance.",
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
    deadline: str | None,
    dry_run: bool,
    wait: bool,
    flows: tuple[str, ...],
    db: str,
    leases: str | None,
    output: str,
) -> None:
    """Re-run a stopped instance once its fault is fixed, never rewriting its history.

    Failed, TimedOut (with --deadline), Cancelled or Terminated: re-runs from --from, any
    step up to where it stopped. Steps before it keep their results; effects of it and later
    steps that still stand are undone first by their compensations; then they run again,
    each under a new idempotency key. CompensationFailed: the compensations still owed
    re-run, from the one that ran out. Quarantined (its journal did not match its plan): it
    resumes where it stopped, once --flows carries the code it was started with. Every try
    is a new attempt row. Exits 4 when the instance cannot be replayed from --from (the
    message names where it can), 3 if there is no such instance, 2 for a bad --deadline,
    and 1 when a --wait replay ends CompensationFailed again or, forward, Failed again.
    """
    plans = plans_or_fail(flows)
    new_deadline = _deadline(deadline)
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
                host = command_host(stores, plans)
                try:
                    planned = await host.replay(
                        instance_id, target, dry_run=dry_run, deadline=new_deadline
                    )
                    return planned, None
                except FlowNotFound as exc:
                    raise not_carried(exc, flows, plans) from exc
            async with command_host(stores, plans) as host:
                try:
                    planned = await host.replay(instance_id, target, deadline=new_deadline)
                except FlowNotFound as exc:
                    raise not_carried(exc, flows, plans) from exc
                await host.wait_idle()
                return planned, await host.get(instance_id)
        finally:
            await stores.close()

    planned, final = run(main())
    doc = replay_dict(planned)
    doc["dry_run"] = dry_run
    doc["final_state"] = final.state.value if final is not None else None
    doc["error"] = decoded(final.error) if final is not None else None
    if output == "json":
        emit_json(doc)
    else:
        click.echo(replay_text(doc))
    if final is not None and not _replay_ok(planned.mode, final.state):
        click.echo(
            f"error: the replay of {planned.instance_id} ended {final.state.value} again: "
            f"{final.error}; fix the fault and replay again (`flowx show` has every attempt)",
            err=True,
        )
        sys.exit(EXIT_ERROR)
