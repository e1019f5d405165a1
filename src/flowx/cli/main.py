"""``flowx``: run a worker, start, list and inspect instances, signal, replay, cancel and
terminate them, keep and sweep by retention policy, look at the outbox, migrate a store.

This module only puts the command groups together (each lives in its own module) and is the
console-script entry point, ``flowx = "flowx.cli.main:main"``, also run as
``python -m flowx.cli.main``. Exit codes are documented in ``flowx.cli.exits``.
"""

from __future__ import annotations

import copy

from flowx.cli.app import cli
from flowx.cli.db import migrate
from flowx.cli.doctor import doctor
from flowx.cli.instances import count, list_, show, start
from flowx.cli.keys import keys
from flowx.cli.outbox import outbox
from flowx.cli.results import result
from flowx.cli.retention import retention
from flowx.cli.serve import serve
from flowx.cli.signals import replay, signal
from flowx.cli.stops import cancel, terminate
from flowx.cli.worker import worker

__all__ = ["cli", "main"]

# In the order --help listed them before the split (click sorts them by name anyway).
for _command in (
    worker,
    start,
    list_,
    count,
    show,
    result,
    signal,
    replay,
    cancel,
    terminate,
    retention,
    migrate,
    doctor,
    outbox,
    serve,
    keys,
):
    cli.add_command(_command)

# ``describe``: the name a Temporal user types for ``show``; the same command under it.
describe = copy.copy(show)
describe.help = "The same as `flowx show`: an instance, its step timeline, inbox and events."
describe.short_help = "The same as show."
cli.add_command(describe, name="describe")


def main() -> None:
    """The console-script entry point (``flowx = "flowx.cli.main:main"``)."""
    cli(prog_name="flowx")


if __name__ == "__main__":
    main()
