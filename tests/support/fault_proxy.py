"""A small asyncio TCP fault proxy for loopback fault tests (ARCHITECTURE.md "Hazards").

``FaultProxy(host, port)`` listens on 127.0.0.1 on a free port and forwards every connection
to the target. Its mode can be changed at any moment, affecting new *and* open connections:

- ``await proxy.forward()``: pass bytes through (the default).
- ``await proxy.refuse()``: the service is down. The listening socket is closed, so a new
  connection is refused (ECONNREFUSED), and every open connection is cut with a TCP reset.
- ``await proxy.blackhole()``: a partition. New connections are accepted but nothing is
  forwarded; open connections stall with their bytes held, not dropped, so when the proxy
  forwards again they are delivered late — as TCP retransmission delivers them after a heal.
- ``await proxy.delay(seconds)``: forward every chunk after ``seconds``.

Used only with loopback addresses: it is a test fixture, not a network tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Literal

Mode = Literal["forward", "refuse", "blackhole"]
_LOOPBACK = "127.0.0.1"
_CHUNK = 64 * 1024


class _Cut(Exception):
    """The proxy cut this connection (refuse mode)."""


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN: SO_LINGER 0, then abort."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Connection:
    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.cut = False

    def reset(self) -> None:
        self.cut = True
        _reset(self.client)
        if self.upstream is not None:
            _reset(self.upstream)
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """Forward 127.0.0.1:``port`` to ``target_host:target_port``, with faults on demand."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = 0
        self.mode: Mode = "forward"
        self.delay_seconds = 0.0
        #: Connections accepted so far (a test can check the client really came through here).
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on a free loopback port (kept across ``refuse()``/``forward()``)."""
        await self._listen()

    async def stop(self) -> None:
        """Stop listening and cut every connection."""
        await self._close_listener()
        self._cut_all()
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    async def _listen(self) -> None:
        if self._server is not None:
            return
        self._server = await asyncio.start_server(
            self._accept, _LOOPBACK, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close_listener(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()

    def _cut_all(self) -> None:
        for conn in list(self._connections):
            conn.reset()
        self._connections.clear()

    # -- modes ---------------------------------------------------------------------------

    async def forward(self) -> None:
        """Pass bytes through again; stalled connections deliver what they held."""
        self.mode, self.delay_seconds = "forward", 0.0
        await self._listen()
        self._flowing.set()

    async def refuse(self) -> None:
        """The target is down: refuse new connections and reset the open ones."""
        self.mode = "refuse"
        await self._close_listener()
        self._cut_all()
        self._flowing.set()  # wake stalled pumps so they see the cut

    async def blackhole(self) -> None:
        """A partition: accept, never forward; open connections stall."""
        self.mode = "blackhole"
        await self._listen()
        self._flowing.clear()

    async def delay(self, seconds: float) -> None:
        """Forward every chunk ``seconds`` late."""
        self.mode, self.delay_seconds = "forward", seconds
        await self._listen()
        self._flowing.set()

    # -- the plumbing --------------------------------------------------------------------

    async def _gate(self, conn: _Connection) -> None:
        while True:
            if conn.cut or self.mode == "refuse":
                raise _Cut
            if self.mode == "forward":
                return
            self._flowing.clear()
            await self._flowing.wait()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        conn = _Connection(writer)
        self._connections.add(conn)
        self.accepted += 1
        try:
            await self._gate(conn)  # a black hole accepts and then says nothing
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
            conn.upstream = up_writer
            if conn.cut:
                raise _Cut
            pumps = [
                asyncio.create_task(self._pump(conn, reader, up_writer)),
                asyncio.create_task(self._pump(conn, up_reader, writer)),
            ]
            conn.tasks.update(pumps)
            # When either direction ends, the connection ends.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        except (_Cut, OSError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(conn)
            self._handlers.discard(task)
            if conn.cut:
                conn.reset()
            else:
                for w in (writer, conn.upstream):
                    if w is not None:
                        w.close()

    async def _pump(
        self, conn: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(_Cut, OSError):
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    return
                await self._gate(conn)
                if self.delay_seconds:
                    await asyncio.sleep(self.delay_seconds)
                    await self._gate(conn)
                writer.write(data)
                await writer.drain()
