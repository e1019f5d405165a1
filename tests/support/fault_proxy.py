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
- ``await proxy.withhold_replies()``: an answer that never comes (R9.1). On every connection
  open now, requests still reach the server (so it executes them, and a COMMIT lands), but
  nothing it sends back is delivered; the connection stays open. New connections are not
  affected: a pooler that lost one server session keeps serving fresh ones.
- ``proxy.withhold_next_reply(when=...)``: the same fault on exactly one connection: the next
  one to send a request (for which ``when(chunk)`` holds, if given: a PostgreSQL client may
  prepare a statement in a round trip of its own before executing it). Returns an event set
  once it is caught, so a test can aim the fault at one round trip (a step's commit) without
  guessing which pooled connection will carry it.

``forward()`` delivers withheld replies too, late, as a healed peer would.

Used only with loopback addresses: it is a test fixture, not a network tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
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
        #: Clear while the server's replies on this connection are withheld.
        self.replies = asyncio.Event()
        self.replies.set()

    def reset(self) -> None:
        self.cut = True
        self.replies.set()
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
        #: Armed by ``withhold_next_reply``: set when the next request's connection is caught.
        self._trap: asyncio.Event | None = None
        self._trap_when: Callable[[bytes], bool] | None = None

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
        """Pass bytes through again; stalled connections deliver what they held, and
        withheld replies are delivered."""
        self.mode, self.delay_seconds = "forward", 0.0
        self._trap = None
        await self._listen()
        self._flowing.set()
        for conn in list(self._connections):
            conn.replies.set()

    async def withhold_replies(self) -> int:
        """Every connection open now: requests go through, replies never come back (until
        ``forward()``). Returns how many connections were caught."""
        caught = 0
        for conn in list(self._connections):
            if not conn.cut:
                conn.replies.clear()
                caught += 1
        return caught

    def withhold_next_reply(self, when: Callable[[bytes], bool] | None = None) -> asyncio.Event:
        """Withhold the replies of the next connection to send a request (one for which
        ``when(chunk)`` holds), and only its, from that request on.

        Synchronous on purpose: arm it and release what makes the request in one step, with
        no await between them for another task's request to slip in."""
        self._trap = asyncio.Event()
        self._trap_when = when
        return self._trap

    @property
    def withheld(self) -> int:
        """Open connections whose replies are being withheld."""
        return sum(1 for c in self._connections if not c.replies.is_set())

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
                asyncio.create_task(self._pump(conn, reader, up_writer, reply=False)),
                asyncio.create_task(self._pump(conn, up_reader, writer, reply=True)),
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
        self,
        conn: _Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        reply: bool,
    ) -> None:
        with contextlib.suppress(_Cut, OSError):
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    return
                if (
                    not reply
                    and self._trap is not None
                    and (self._trap_when is None or self._trap_when(data))
                ):
                    # Caught before the request is forwarded: its reply cannot slip through.
                    trap, self._trap = self._trap, None
                    conn.replies.clear()
                    trap.set()
                if reply:
                    # Held, not dropped: the server has sent it; the client never sees it.
                    await conn.replies.wait()
                await self._gate(conn)
                if self.delay_seconds:
                    await asyncio.sleep(self.delay_seconds)
                    await self._gate(conn)
                writer.write(data)
                await writer.drain()
