"""A real API server for tests that speak HTTP from outside the event loop (schemathesis, a
browser): uvicorn on a loopback socket in a thread of its own, over a host on a SQLite
journal, with helpers to run a coroutine on the server's loop."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import uvicorn

import flowx
from flowx.api import create_app
from tests.api.api_flows import FLOWS
from tests.support.polling import until_sync

T = TypeVar("T")


@dataclass
class LiveServer:
    url: str
    db: Path
    host: flowx.FlowHost
    loop: asyncio.AbstractEventLoop

    def call(self, make: Callable[[], Awaitable[T]], within: float = 30) -> T:
        """Run a coroutine on the server's loop (where its host lives) and return its result."""

        async def run() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(within)

    def idle(self) -> None:
        """Wait until nothing runs on the server's host."""
        self.call(lambda: self.host.wait_idle(timeout=10))


@contextmanager
def live_server(db: Path, *, run_here: bool = False, **settings: Any) -> Iterator[LiveServer]:
    host = flowx.FlowHost(
        store=flowx.sqlite(str(db)),
        flows=FLOWS,
        settings=flowx.HostSettings.load(recovery=False, timers=False, **settings),
    )
    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as flowx serve binds it
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    app = create_app(host, run_here=run_here, owns_host=True)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="on"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve([sock]),))
    thread.start()
    try:
        until_sync(lambda: server.started or not thread.is_alive(), within=30, what="uvicorn up")
        assert server.started, "the API server did not start"
        yield LiveServer(f"http://127.0.0.1:{sock.getsockname()[1]}", db, host, loop)
    finally:
        server.should_exit = True
        thread.join(30)
        loop.close()
        sock.close()
