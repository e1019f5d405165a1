"""``flowx serve``: the HTTP API (and, with ``--work``, a worker in the same process).

Bound to loopback by default. Any other address needs a token (``FLOWX_API_TOKEN``): an
API with no token lets anyone who reaches it cancel and terminate instances. The socket is
bound here, before the server starts, so a port that is taken is one clear line, and
``--port 0`` can name the port it got (on stdout and in ``--ready-file``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from flowx.cli.app import db_option, flows_option, leases_option
from flowx.cli.exits import fail
from flowx.errors import FlowXError
from flowx.hosting.host import FlowHost
from flowx.hosting.settings import HostSettings
from flowx.hosting.stores import from_url
from flowx.hosting.worker import configure_logging, load_flows

log = logging.getLogger("flowx.api")


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _server_class() -> type[Any]:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but a SIGTERM or Ctrl-C that it turned into a graceful shutdown
        (requests finished, the host drained) ends the process with 0, as ``flowx worker``
        does, rather than being raised again to kill it."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            handled = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    return Server


def _bind(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Inherited by every accepted connection: without it a small answer waits for the
    # client's delayed ACK (Nagle), about 40 ms a request, measured.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise FlowXError(
            f"cannot listen on {address}:{port}: {exc.strerror or exc}; pick another --port "
            "(0: any free one)",
            code="api.cannot_bind",
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


@click.command()
@db_option
@leases_option
@flows_option
@click.option("--host", "address", default="127.0.0.1", show_default=True, help="Bind address.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option(
    "--work/--no-work",
    default=False,
    help="Also be a worker: run what the API starts, recover, fire timers.",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the API's URL here once it listens (for supervisors and tests).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
)
def serve(
    db: str,
    leases: str | None,
    flows: tuple[str, ...],
    address: str,
    port: int,
    work: bool,
    ready_file: Path | None,
    log_level: str,
) -> None:
    """Serve the HTTP API (OpenAPI at /openapi.json) until SIGTERM or Ctrl-C.

    Without --work, a start leaves the instance Pending for the workers and the process runs
    no flow step (a cancel's compensations excepted); tokens come from FLOWX_API_TOKEN
    (admin) and FLOWX_API_READ_TOKEN."""
    configure_logging("text", log_level)
    try:
        import uvicorn

        from flowx.api import create_app
    except ImportError as exc:
        fail(
            FlowXError(f"flowx serve needs the api extra: pip install 'flowx-runtime[api]' ({exc})")
        )
    try:
        overrides: dict[str, Any] = {} if work else {"recovery": False, "timers": False}
        if not work:
            overrides["retention"] = False
        settings = HostSettings.load(**overrides)
        plans = load_flows(flows)
        if settings.api_token is None and settings.api_read_token is None:
            if not _loopback(address):
                raise FlowXError(
                    f"refusing to serve on {address} with no token: anyone who reaches it could "
                    "start, cancel and terminate instances; set FLOWX_API_TOKEN (and "
                    "FLOWX_API_READ_TOKEN for read-only access), or bind to 127.0.0.1",
                    code="api.no_token",
                )
            log.warning("the API asks for no token: anyone on this machine may use it")
        # A store URL that cannot be used is one ``error:`` line, like every other command's,
        # not a traceback: built before the socket is bound, so nothing is left listening.
        store = from_url(db, leases=leases)
        sock = _bind(address, port)
    except FlowXError as exc:
        fail(exc)
    host = FlowHost(store=store, flows=plans, settings=settings)
    app = create_app(host, run_here=work, owns_host=True)
    bound = sock.getsockname()[1]
    shown = f"[{address}]" if ":" in address else address
    url = f"http://{shown}:{bound}"
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on")
    server = _server_class()(config)

    async def main() -> None:
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        # uvicorn says it has started by a flag, not an event.
        while not server.started and not task.done():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        if server.started:
            click.echo(f"flowx API on {url} (OpenAPI: {url}/openapi.json)")
            if ready_file is not None:
                # Whole or absent: a reader never sees a half-written URL.
                partial = ready_file.with_name(ready_file.name + ".partial")
                partial.write_text(url)
                partial.replace(ready_file)
        await task

    try:
        asyncio.run(main())
    finally:
        sock.close()
        if ready_file is not None:
            ready_file.unlink(missing_ok=True)
    if not server.started:
        sys.exit(1)
