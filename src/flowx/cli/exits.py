"""Exit codes, chosen by the class of the FlowX error, and the one way a command fails.

Exit codes are part of the interface, so scripts can branch without parsing messages:

* 0 — done;
* 1 — a FlowX error (bad input, bad store URL, a file that is not a journal, ...);
* 2 — a usage error (click's own: unknown option, bad ``--before`` cursor, ...; an argument,
  ``--input``, ``--input-file`` or ``--payload`` that is not UTF-8 JSON FlowX can read or
  store; a signal the flow never waits for, a payload of the wrong shape, a flow ``--flows``
  does not carry, a ``--flows`` that cannot be loaded, a cancel without a reason);
* 3 — not found: no such instance, no such flow among ``--flows``, or (for a command that
  only reads) no journal where ``--db`` points;
* 4 — illegal state: the instance is in the wrong state for what was asked (a signal to an
  instance that has ended, a replay of one that is not stopped where ``--from`` says, a cancel
  of one that completed, a ``result`` of one that has not ended).

Every FlowX error is printed as one ``error: ...`` line on stderr saying what to do, never as a
traceback: an operator at a terminal needs the fix, not the call stack. Anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Coroutine, Mapping
from typing import Any, Final, NoReturn, TypeVar

import click

from flowx import codec
from flowx.errors import (
    DeadLetterNotFound,
    FlowNotFound,
    FlowXError,
    IllegalState,
    InstanceNotFound,
    JournalNotFound,
    RequestInvalid,
)
from flowx.stores.errors import InstanceFinished, UnknownInstance

T = TypeVar("T")

EXIT_ERROR: Final = 1
#: click's own code for a usage error; also a FlowX error that says the request was malformed.
EXIT_USAGE: Final = 2
EXIT_NOT_FOUND: Final = 3
#: A command that acts on an instance (signal, replay) found it in the wrong state.
EXIT_ILLEGAL_STATE: Final = 4

#: The one table: an error's class (or the nearest base class listed) → its exit code; any
#: other FlowX error exits ``EXIT_ERROR``.
EXIT_CODES: Final[Mapping[type[FlowXError], int]] = {
    InstanceNotFound: EXIT_NOT_FOUND,
    JournalNotFound: EXIT_NOT_FOUND,
    UnknownInstance: EXIT_NOT_FOUND,
    FlowNotFound: EXIT_NOT_FOUND,
    DeadLetterNotFound: EXIT_NOT_FOUND,
    IllegalState: EXIT_ILLEGAL_STATE,
    InstanceFinished: EXIT_ILLEGAL_STATE,
    # A value the journal cannot store (R9.5) is malformed too: nothing was written, and the
    # same value never will be.
    RequestInvalid: EXIT_USAGE,
}


def exit_code(exc: FlowXError) -> int:
    """The exit code for a FlowX error: 3 when something named does not exist, 4 when the
    instance is in the wrong state, 2 when the request itself is malformed, else 1."""
    for cls in type(exc).__mro__:
        code = EXIT_CODES.get(cls)
        if code is not None:
            return code
    return EXIT_ERROR


def fail(exc: FlowXError) -> NoReturn:
    """Print ``exc`` as one line on stderr and exit with its code. A command run with
    ``-o json`` also writes it on stdout as ``{"error": {"code", "message", "exit"}}``, so a
    script reads every outcome of the command from one place in one format."""
    # A message may quote what was given, lone surrogates included: escape them, or
    # printing the error would itself fail with a UnicodeEncodeError.
    message = codec.printable(str(exc))
    code = exit_code(exc)
    context = click.get_current_context(silent=True)
    if context is not None and context.params.get("output") == "json":
        doc = {"error": {"code": exc.code, "message": message, "exit": code}}
        click.echo(json.dumps(doc, sort_keys=True))
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine to completion, turning a FlowX error into a line and an exit code.

    Each command is one ``asyncio.run``: the stores' threads and the event loop live exactly as
    long as the command does.
    """
    try:
        return asyncio.run(coro)
    except FlowXError as exc:
        fail(exc)
