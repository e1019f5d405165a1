"""The flow the multi-host test runs, imported by ``flowx worker`` processes that each live in
a network namespace of their own (``--flows tests.hosts.host_flows:FLOWS``).

Everything a step shares with the test goes over the network, to the test's PostgreSQL at the
address the worker was given (``HOSTS_LEDGER_DSN``): no file, no localhost, no memory. Each
step records one effect in the ``ledger`` table — its own id, the instance, the step and the
node (``HOSTS_NODE``) — and returns the effect's id, so the journal row of a step names the
effect it committed; an effect no row names is one whose commit never landed (as in the chaos
rig, ``benchmarks/rig/flows.py``).

``s2`` then waits for its wave's gate: ``gate.open`` in the same database, which the test sets. So
every worker's slots fill with instances that have committed ``s1`` and hold an uncommitted
``s2`` effect, and the test kills or partitions a worker at a known point, not a slept one.
One poller per process reads the gate (the steps share it); it and every ledger write retry
through a partition, with a client-side deadline on each round trip (``connect_timeout``,
``tcp_user_timeout`` in the DSN), so a partitioned worker's steps finish after the heal and
try to commit late — which is what the test needs to see refused.

``s1``'s compensation records an ``undo`` effect: a zombie must never run one (R3.5). The
flow ends by staging one ``OrderDone`` event, which a worker given ``--publish`` relays to a
broker — over its veth too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from typing import Any

import psycopg
from pydantic import BaseModel

import flowx

INSERT = (
    "INSERT INTO ledger (effect_id, instance_id, step, node) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (effect_id) DO NOTHING"
)
#: How long a step keeps retrying the database through a partition before it gives up.
PATIENCE = 120.0

_conn: psycopg.AsyncConnection[Any] | None = None
_gates: dict[int, asyncio.Future[None]] = {}


class Order(BaseModel):
    n: int
    #: Which gate ``s2`` waits for: the test opens one wave's gate at a time.
    wave: int = 1


class OrderState(BaseModel):
    s1: str | None = None
    s2: str | None = None
    s3: str | None = None


async def _connection() -> psycopg.AsyncConnection[Any]:
    global _conn
    if _conn is None or _conn.closed:
        _conn = await psycopg.AsyncConnection.connect(
            os.environ["HOSTS_LEDGER_DSN"], autocommit=True
        )
    return _conn


async def _drop(conn: psycopg.AsyncConnection[Any]) -> None:
    """Forget a connection that failed, unless another step has replaced it already."""
    global _conn
    if _conn is conn:
        _conn = None
    with contextlib.suppress(psycopg.Error):
        await conn.close()


async def _sql(query: str, *args: Any) -> list[tuple[Any, ...]]:
    """Run ``query``, retrying through a network outage; the same statement again after an
    unknown outcome must be harmless (an insert carries its id, fixed before the first try)."""
    deadline = time.monotonic() + PATIENCE
    while True:
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            conn = await _connection()
            cur = await conn.execute(query, args or None)
            return await cur.fetchall() if cur.description else []
        except psycopg.OperationalError:
            if conn is not None:
                await _drop(conn)
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _poll_gate(wave: int) -> None:
    deadline = time.monotonic() + PATIENCE  # bounded: a test that never opens it fails the step
    while not (await _sql("SELECT open FROM gate WHERE wave = %s", wave))[0][0]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {wave} was not opened within {PATIENCE:.0f} s")
        await asyncio.sleep(0.1)


async def _gate_opened(wave: int) -> None:
    """Return once the test has opened ``wave``'s gate; one poller per wave and process,
    whatever the number of steps waiting (a cancelled step does not cancel it for the
    others)."""
    if wave not in _gates:
        _gates[wave] = asyncio.ensure_future(_poll_gate(wave))
    await asyncio.shield(_gates[wave])


async def _effect(ctx: flowx.StepContext, step: str) -> str:
    effect = str(uuid.uuid4())  # a re-execution is a new effect, recorded again
    await _sql(INSERT, effect, ctx.instance_id, step, os.environ["HOSTS_NODE"])
    return effect


@flowx.capability("hosts.s1", version="1.0.0", idempotent=False)
async def s1(ctx: flowx.StepContext, order: Order) -> str:
    return await _effect(ctx, "s1")


@flowx.capability("hosts.s2", version="1.0.0", idempotent=False)
async def s2(ctx: flowx.StepContext, order: Order) -> str:
    effect = await _effect(ctx, "s2")
    await _gate_opened(order.wave)
    return effect


@flowx.capability("hosts.s3", version="1.0.0", idempotent=False)
async def s3(ctx: flowx.StepContext, order: Order) -> str:
    return await _effect(ctx, "s3")


@flowx.capability("hosts.undo", version="1.0.0", idempotent=False)
async def undo(ctx: flowx.StepContext, order: Order) -> None:
    await _effect(ctx, "undo")


@flowx.event("hosts.order_done", version="1")
class OrderDone(BaseModel):
    n: int
    wave: int


def _done(o: Order, s: OrderState) -> OrderDone:
    return OrderDone(n=o.n, wave=o.wave)


order = (
    flowx.flow("hosts.order", version="1.0.0", input=Order, state=OrderState)
    .step(s1, name="s1", into="s1", compensate=undo)
    .step(s2, name="s2", into="s2")
    .step(s3, name="s3", into="s3")
    .emit(OrderDone, _done, name="done")
    .build()
)

FLOWS = [order]
