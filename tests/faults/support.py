"""What the fault tests share: PostgreSQL through a fault proxy, bounded waits, the node a
capability runs on, and a record of every journal write each node attempted.

The fault tests run several in-process hosts (nodes) in one event loop. Effects are kept in a
ledger outside the journal (a plain list in this process), so a test counts what really ran,
not what the journal says ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import psycopg

import flowx
from flowx.stores.records import History, StepCommit
from tests.postgres_support import PG_DSN
from tests.support.fault_proxy import FaultProxy

#: The node a capability runs on: each host's runs inherit it from the task that spawned them
#: (``on_node`` around ``host.open()`` for recovery, around ``host.start()`` for a start).
NODE: contextvars.ContextVar[str] = contextvars.ContextVar("flowx_fault_node", default="?")


@contextlib.contextmanager
def on_node(name: str) -> Iterator[None]:
    token = NODE.set(name)
    try:
        yield
    finally:
        NODE.reset(token)


@dataclass(frozen=True)
class Effect:
    node: str
    instance_id: str
    step: str
    attempt: int


@dataclass
class Ledger:
    """Every effect a capability performed, kept outside the journal."""

    effects: list[Effect] = field(default_factory=list)

    def record(self, ctx: flowx.StepContext, step: str) -> str:
        node = NODE.get()
        self.effects.append(Effect(node, ctx.instance_id, step, ctx.attempt))
        return node

    def count(self, instance_id: str, step: str) -> int:
        return sum(1 for e in self.effects if e.instance_id == instance_id and e.step == step)

    def nodes(self, instance_id: str, step: str) -> list[str]:
        return [e.node for e in self.effects if e.instance_id == instance_id and e.step == step]

    def clear(self) -> None:
        self.effects.clear()


def via(proxy: FaultProxy) -> str:
    """The test PostgreSQL's DSN, through ``proxy``."""
    target = urlsplit(PG_DSN)
    return f"postgresql://{target.username or 'postgres'}@127.0.0.1:{proxy.port}{target.path}"


def executes(chunk: bytes) -> bool:
    """A PostgreSQL client request that runs a statement: it holds an Execute (``E``) or a
    simple Query (``Q``) message. A Parse sent alone (psycopg prepares a statement in a round
    trip of its own the first time a connection runs it) does not: withholding its reply
    would stop the statement from ever running, and the fault tests need it to run."""
    offset = 0
    kinds: set[int] = set()
    while offset + 5 <= len(chunk):
        kinds.add(chunk[offset])
        length = int.from_bytes(chunk[offset + 1 : offset + 5], "big")
        if length < 4:
            return False  # not a frame boundary: not a request this test aims at
        offset += 1 + length
    return offset == len(chunk) and bool(kinds & {ord("E"), ord("Q")})


def proxy_to_postgres() -> FaultProxy:
    target = urlsplit(PG_DSN)
    return FaultProxy(target.hostname or "127.0.0.1", target.port or 5432)


async def signalled(event: asyncio.Event, *, within: float, what: str) -> None:
    """Wait for ``event``; fail saying ``what`` did not happen within ``within`` seconds."""
    try:
        await asyncio.wait_for(event.wait(), within)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {within:g}s") from None


@dataclass(frozen=True)
class Write:
    """One step commit (or transition) a node attempted: its token, and how it ended."""

    node: str
    instance_id: str
    token: int
    step: str | None
    #: The step row's sequence when the journal answered with one.
    sequence: int | None
    error: BaseException | None
    sent: float
    ended: float


@dataclass(frozen=True)
class Open:
    """A takeover: the journal raised the instance's fence to ``token`` (R2.4)."""

    node: str
    instance_id: str
    token: int
    #: The first sequence a write under this token can take.
    next_sequence: int
    ended: float


class WriteTap:
    """Records every commit and every open a host makes (around ``journal.commit`` and
    ``journal.open``), answered or not, to check the fence from outside."""

    def __init__(self, host: flowx.FlowHost, node: str) -> None:
        assert host.store is not None
        self.writes: list[Write] = []
        self.opens: list[Open] = []
        journal = host.store.journal
        commit, open_ = journal.commit, journal.open

        async def tapped(c: StepCommit) -> int | None:
            sent = time.monotonic()
            step = c.step.step_name if c.step is not None else None
            try:
                sequence = await commit(c)
            except BaseException as exc:
                self.writes.append(
                    Write(node, c.instance_id, c.token, step, None, exc, sent, time.monotonic())
                )
                raise
            self.writes.append(
                Write(node, c.instance_id, c.token, step, sequence, None, sent, time.monotonic())
            )
            return sequence

        async def opened(instance_id: str, *, token: int, now: Any) -> History:
            history = await open_(instance_id, token=token, now=now)
            self.opens.append(
                Open(
                    node,
                    instance_id,
                    token,
                    history.instance.next_sequence,
                    time.monotonic(),
                )
            )
            return history

        journal.commit = tapped  # type: ignore[method-assign, assignment]
        journal.open = opened  # type: ignore[method-assign]

    def of(self, instance_id: str) -> list[Write]:
        return [w for w in self.writes if w.instance_id == instance_id]


def writes_past_a_fence(*taps: WriteTap) -> list[str]:
    """Every accepted write that a newer token had already fenced off (R2.4): a step row
    placed at or after a takeover's first sequence under an older token, or any write sent
    after such a takeover had completed (one process: one monotonic clock)."""
    opens = [o for t in taps for o in t.opens]
    found: list[str] = []
    for w in (w for t in taps for w in t.writes if w.error is None):
        for o in opens:
            if o.instance_id != w.instance_id or o.token <= w.token:
                continue
            if w.sequence is not None and w.sequence >= o.next_sequence:
                found.append(f"{w} landed at or after {o}")
            elif o.ended < w.sent:
                found.append(f"{w} was sent after {o}")
    return found


@contextlib.asynccontextmanager
async def sql(schema: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A direct connection to the test PostgreSQL, in ``schema``: the test's own eyes on the
    journal, past every proxy."""
    conn = await psycopg.AsyncConnection.connect(
        PG_DSN, autocommit=True, options=f"-c search_path={schema}"
    )
    try:
        yield conn
    finally:
        await conn.close()


async def rows(schema: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    async with sql(schema) as conn:
        cur = await conn.execute(query, args)
        return list(await cur.fetchall())
