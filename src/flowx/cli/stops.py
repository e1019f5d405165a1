"""``flowx cancel`` and ``flowx terminate``: stop an instance and its sub-flow children (R9.4).

The request is journaled first; then the command stops what no node is running (a
``Pending`` or ``Suspended`` instance) itself: with ``--flows`` carrying the flow it runs the
instance here until it has compensated and ended, without it it ends an instance that owes
no compensation, and leaves the rest ``Pending`` for a worker that carries the flow. An
instance a worker is running stops there, at that worker's next lease renewal.
"""

from __future__ import annotations

import getpass
import socket

import click

from flowx.cli.app import db_option, leases_option, optional_flows_option, output_option
from flowx.cli.connect import command_host, plans_or_fail
from flowx.cli.exits import run
from flowx.cli.render import emit_json, stop_dict, stop_text
from flowx.hosting.stopping import StopOutcome
from flowx.hosting.stores import from_url

#: How long the command waits for the instances it runs itself to finish compensating.
WAIT_FOR_RUNS = 300.0


def default_by() -> str:
    """Who asked, when ``--by`` is not given: the operator's login on this machine."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name in this environment (a container): say so
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _stop_command(mode: str) -> click.Command:
    @click.command(name=mode)
    @click.argument("instance_id")
    @click.option("--reason", required=True, help="Why: kept with the instance's history.")
    @click.option("--by", default=None, help="Who asks (default: your login@host).")
    @optional_flows_option
    @db_option
    @leases_option
    @output_option
    def command(
        instance_id: str,
        reason: str,
        by: str | None,
        flows: tuple[str, ...],
        db: str,
        leases: str | None,
        output: str,
    ) -> None:
        plans = plans_or_fail(flows) if flows else []

        async def main() -> StopOutcome:
            stores = from_url(db, leases=leases)
            try:
                async with command_host(stores, plans) as host:
                    act = host.cancel if mode == "cancel" else host.terminate
                    outcome = await act(instance_id, reason, by=by or default_by())
                    # What it started here (a compensation) ends before the command does.
                    await host.wait_idle(WAIT_FOR_RUNS)
                    record = await host.get(instance_id)
                    return StopOutcome(
                        instance_id=outcome.instance_id,
                        mode=outcome.mode,
                        status=outcome.status,
                        state=record.state,
                        reached=outcome.reached,
                        waiting=outcome.waiting,
                    )
            finally:
                await stores.close()

        doc = stop_dict(run(main()))
        if output == "json":
            emit_json(doc)
            return
        click.echo(stop_text(doc))

    return command


cancel = _stop_command("cancel")
cancel.help = """Cancel an instance and its unfinished sub-flow children.

Each stops at its next step boundary (a running step is cut, as a step timeout cuts it),
compensates the steps that finished, and ends Cancelled with --reason and --by as its error.
A Pending or Suspended instance is stopped by this command: run here until it has
compensated if --flows carries its flow, ended here if it has no finished step, else left
Pending for a worker that carries the flow. Repeating it is harmless. Exits 3 if there is no
such instance, 4 if it has already ended other than by a cancel or terminate.
"""
terminate = _stop_command("terminate")
terminate.help = """Terminate an instance and its unfinished sub-flow children.

Like cancel, but nothing is compensated (not even a compensation under way) and it ends
Terminated; a waiting instance is ended by this command whatever it ran. A terminate may
follow a cancel, never the reverse. Exits 3 if there is no such instance, 4 if it has already
ended other than by a cancel or terminate.
"""
