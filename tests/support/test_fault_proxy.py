"""The fault proxy itself: each mode does what the fault tests rely on it to do."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tests.support.fault_proxy import FaultProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    fault = FaultProxy("127.0.0.1", server.sockets[0].getsockname()[1])
    await fault.start()
    yield fault
    await fault.stop()
    server.close()


async def _round_trip(port: int, payload: bytes = b"ping") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), 2)
    finally:
        writer.close()


async def test_forward_passes_bytes_both_ways(proxy: FaultProxy) -> None:
    assert proxy.port != 0
    assert await _round_trip(proxy.port) == b"ping"
    assert proxy.accepted == 1


async def test_refuse_refuses_new_connections_and_resets_open_ones(proxy: FaultProxy) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"x")
    assert await reader.readexactly(1) == b"x"
    await proxy.refuse()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", proxy.port)
    # The open connection is cut: a read ends (reset or EOF) instead of hanging.
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(reader.readexactly(1), 2)
    writer.close()
    await proxy.forward()  # same port again
    assert await _round_trip(proxy.port) == b"ping"


async def test_blackhole_accepts_but_stalls_and_delivers_after_the_heal(
    proxy: FaultProxy,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    await proxy.blackhole()
    writer.write(b"held")
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(4), 0.3)
    # A new connection is accepted, and stalls too.
    r2, w2 = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", proxy.port), 1)
    w2.write(b"new!")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(r2.readexactly(4), 0.3)
    await proxy.forward()
    assert await asyncio.wait_for(reader.readexactly(4), 2) == b"held"
    assert await asyncio.wait_for(r2.readexactly(4), 2) == b"new!"
    writer.close()
    w2.close()


async def test_delay_forwards_late(proxy: FaultProxy) -> None:
    await proxy.delay(0.3)
    began = time.monotonic()
    assert await _round_trip(proxy.port) == b"ping"
    assert time.monotonic() - began >= 0.55  # 0.3 s each way


async def test_withhold_replies_delivers_requests_but_never_their_answers(
    proxy: FaultProxy,
) -> None:
    """The R9.1 fault: the server gets (and executes) the request; the answer never comes,
    and the connection stays open. New connections are not affected."""
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"a")
    assert await reader.readexactly(1) == b"a"
    assert await proxy.withhold_replies() == 1
    assert proxy.withheld == 1
    writer.write(b"held")
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(4), 0.3)
    assert not reader.at_eof()  # silence, not a close
    assert await _round_trip(proxy.port) == b"ping"  # a fresh connection is answered
    await proxy.forward()
    assert await asyncio.wait_for(reader.readexactly(4), 2) == b"held"  # late, not lost
    assert proxy.withheld == 0
    writer.close()


async def test_withhold_next_reply_catches_only_the_next_connection_to_send() -> None:
    received: list[bytes] = []

    async def recording_echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(1024):
                received.append(data)
                w.write(data)
                await w.drain()
        except OSError:
            pass
        finally:
            w.close()

    server = await asyncio.start_server(recording_echo, "127.0.0.1", 0)
    async with FaultProxy("127.0.0.1", server.sockets[0].getsockname()[1]) as proxy:
        r1, w1 = await asyncio.open_connection("127.0.0.1", proxy.port)
        r2, w2 = await asyncio.open_connection("127.0.0.1", proxy.port)
        caught = proxy.withhold_next_reply(lambda chunk: chunk.startswith(b"commit"))
        w2.write(b"prepare")  # not what the trap waits for: answered
        assert await asyncio.wait_for(r2.readexactly(7), 2) == b"prepare"
        assert not caught.is_set()
        w2.write(b"commit")
        await asyncio.wait_for(caught.wait(), 2)
        deadline = time.monotonic() + 2
        while b"commit" not in b"".join(received):
            assert time.monotonic() < deadline, "the request never reached the server"
            await asyncio.sleep(0.01)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(r2.readexactly(6), 0.3)
        # The trap was one shot: the other connection, and later requests, are answered.
        w1.write(b"renew")
        assert await asyncio.wait_for(r1.readexactly(5), 2) == b"renew"
        assert proxy.withheld == 1
        for w in (w1, w2):
            w.close()
    server.close()
