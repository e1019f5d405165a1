"""How a ``flowx worker`` process stops, whatever its capabilities are doing (issue 12 item 5).

- The first SIGTERM/SIGINT starts the drain (R7.2), which has one budget,
  ``shutdown_drain_timeout``, for all of it.
- A second signal exits at once with ``128 + signum``, as a shell reports a process killed by
  that signal, with one line on stderr and no traceback: the operator asked twice.
- After "stopped" is logged the process must end. A thread that is not a daemon (a leaked
  one, or a library's) keeps the interpreter alive at exit, and a hung capability's thread
  can never be joined; a watchdog ends the process ``EXIT_GRACE`` seconds later with the exit
  code it would have had. Work left behind was handed back or released during the drain, so
  recovery resumes it from its last commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time

log = logging.getLogger("flowx.worker")

#: How long the interpreter gets to exit on its own after "stopped" before it is ended.
EXIT_GRACE = 1.0


class Signals:
    """The worker's stop signals: the first sets ``stop``, a second exits at once."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.received: int | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, signum: int) -> None:
        if self.received is not None:
            name = signal.Signals(signum).name
            # os.write, not logging: a handler or stream lock held by the interrupted code
            # must not keep the process from ending.
            with _quietly():
                os.write(2, f"flowx worker: second {name}, exiting now\n".encode())
            os._exit(128 + signum)
        self.received = signum
        self.stop.set()


def arm_exit_watchdog(code: int, grace: float = EXIT_GRACE) -> threading.Thread:
    """End the process ``grace`` seconds from now with ``code``, unless it has ended by then.

    A daemon thread: it never keeps the interpreter alive itself, and dies with a process that
    exits normally first.
    """

    def watch() -> None:
        time.sleep(grace)
        stuck = [
            t.name
            for t in threading.enumerate()
            if t is not threading.current_thread() and not t.daemon and t.is_alive()
        ]
        with _quietly():
            os.write(
                2,
                (
                    f"flowx worker: still running {grace:g}s after stopping "
                    f"(threads: {', '.join(stuck) or 'none left'}); exiting with {code}\n"
                ).encode(),
            )
        with _quietly():
            sys.stderr.flush()
        os._exit(code)

    thread = threading.Thread(target=watch, name="flowx-exit-watchdog", daemon=True)
    thread.start()
    return thread


def _quietly() -> contextlib.suppress:
    """A write on the way out must not raise (a closed or full stderr)."""
    return contextlib.suppress(Exception)
