"""The engine test kit: what the engine tests share instead of each writing its own (issue 13).

- ``Order``: the input most engine flows run, one order of one tenant. A module whose flows
  need more fields subclasses it (``class Order(kit.Order): lines: list[int] = [...]``).
- ``Ledger``: what capabilities did in the running test (calls counted by name, names told to
  fail, gates a test opens, the scopes they ran in) and a factory of capabilities that count
  themselves, can be broken by name, wait on a gate, and return what the test wants. One
  ledger per test module (capability ids are process-wide); every ledger is emptied before
  each test by the autouse fixture ``fresh_ledgers``, which each module imports as ``_reset``
  (so ``tests/hosting/test_constructs_on_stores.py``, which re-runs these modules on real
  stores, brings it along with them).
- ``rows_of``, ``failure_of``, ``until_state``: reading an instance's journal rows, the
  ``FlowFailed`` a handle ends with, and waiting (bounded) for an instance to settle.

It lives under ``tests/``, not ``flowx.testing``: it is scaffolding for this repository's
engine tests, shaped by what they assert, not an API promised to users (``flowx.testing``
holds what a user's own tests need: ``FakeClock`` and the store conformance suites).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, ClassVar, Protocol, TypeVar

import pytest
from pydantic import BaseModel

import flowx
from flowx.stores.records import InstanceRecord, InstanceState, StepRecord
from tests.support.polling import until


class Order(BaseModel):
    """One order of one tenant: the input of most engine flows (the tenant is the partition
    key of the flows that emit events)."""

    order_id: str
    tenant: str = "acme"


class _Clearable(Protocol):
    def clear(self) -> None: ...


C = TypeVar("C", bound=_Clearable)


@pytest.fixture(autouse=True)
def fresh_ledgers() -> None:
    """Every ledger empty before each test: no count or switch leaks from the one before."""
    for ledger in Ledger.made:
        ledger.reset()


def _done(name: str) -> Callable[[Any], str]:
    return lambda _argument: f"{name}-done"


class Ledger:
    """What the capabilities of one test module did, and the switches a test flips on them."""

    #: Every ledger made, so one autouse fixture empties them all before each test.
    made: ClassVar[list[Ledger]] = []

    def __init__(self, prefix: str) -> None:
        #: The capability id prefix of this module (``edge`` makes ``edge.reserve``).
        self.prefix = prefix
        self.calls: Counter[str] = Counter()
        #: Names whose capability raises on every call, until the test mends them.
        self.broken: set[str] = set()
        #: Names whose capability waits on this event before doing anything else.
        self.gates: dict[str, asyncio.Event] = {}
        #: ``(name, ctx.scope)`` of the capabilities made with ``scoped=True``, in call order.
        self.seen: list[tuple[str, str]] = []
        self._also: list[_Clearable] = []
        Ledger.made.append(self)

    def also_clears(self, container: C) -> C:
        """Empty ``container`` (a module's own switches or records) with the ledger."""
        self._also.append(container)
        return container

    def reset(self) -> None:
        self.calls.clear()
        self.broken.clear()
        self.gates.clear()
        self.seen.clear()
        for container in self._also:
            container.clear()

    def capability(
        self,
        name: str,
        *,
        returns: Callable[[Any], Any] | None = None,
        fails_with: str | None = None,
        non_retryable: bool = False,
        delay: float = 0.0,
        scoped: bool = False,
        idempotent: bool = True,
    ) -> flowx.Capability:
        """``{prefix}.{name}`` at version 1.0.0: counts each call under ``name``, records its
        scope (``scoped``), waits on ``gates[name]`` if set, sleeps ``delay`` (to let a sibling
        overtake it), raises if ``name`` is broken (``fails_with``; a ``NonRetryableError``
        with ``non_retryable``) and otherwise returns ``returns(argument)`` (``"{name}-done"``
        by default)."""
        result = returns or _done(name)
        message = fails_with or (f"{name} refused" if non_retryable else f"{name} is down")

        async def run(ctx: flowx.StepContext, argument: Any) -> Any:
            self.calls[name] += 1
            if scoped:
                self.seen.append((name, ctx.scope))
            gate = self.gates.get(name)
            if gate is not None:
                await gate.wait()
            if delay:
                await asyncio.sleep(delay)
            if name in self.broken:
                raise (flowx.NonRetryableError if non_retryable else RuntimeError)(message)
            return result(argument)

        run.__name__ = name
        return flowx.capability(f"{self.prefix}.{name}", version="1.0.0", idempotent=idempotent)(
            run
        )

    def undo(
        self, name: str, *, scoped: bool = False, fails_with: str | None = None
    ) -> flowx.Capability:
        """A compensation: counts itself (and its scope with ``scoped``), returns nothing,
        fails while ``name`` is broken."""
        return self.capability(
            name, returns=lambda _argument: None, scoped=scoped, fails_with=fails_with
        )


def reservation(order: Any) -> str:
    """What a ``reserve`` capability returns for an order: ``R-<order_id>``."""
    return f"R-{order.order_id}"


async def rows_of(host: flowx.FlowHost, iid: str) -> list[StepRecord]:
    """Every journal row of ``iid``, in commit order."""
    assert host.store is not None
    return list(await host.store.journal.steps(iid))


async def failure_of(handle: flowx.FlowHandle[Any], timeout: float = 30) -> flowx.FlowFailed:
    """The ``FlowFailed`` the instance ends with, within ``timeout`` seconds (failing the test
    if it completes instead)."""
    with pytest.raises(flowx.FlowFailed) as failed:
        await handle.result(timeout=timeout)
    return failed.value


async def until_state(
    host: flowx.FlowHost,
    iid: str,
    state: InstanceState,
    timeout: float = 5.0,
    *,
    idle: bool = True,
) -> InstanceRecord:
    """Wait until ``iid`` is in ``state`` and (``idle``) no run of it is under way on
    ``host``; its record then."""
    seen: list[InstanceRecord] = []

    async def settled() -> bool:
        seen.append(await host.get(iid))
        return seen[-1].state is state and not (idle and iid in host._tasks)

    what = f"{iid} {state.value}" + (" and idle" if idle else "")
    await until(settled, within=timeout, what=what, every=0.01)
    return seen[-1]


#: When the hand-built rows below were written (tests that need no clock).
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def instance_row(plan: flowx.Plan, state: InstanceState, **fields: Any) -> InstanceRecord:
    """An instance row as a store would return it, for tests of pure engine functions that
    read rows (admission, waiting): every column at its fresh-start value but ``fields``."""
    row = InstanceRecord(
        instance_id="i1",
        flow_id=plan.flow_id,
        flow_version=plan.version,
        state=state,
        fence=1,
        next_sequence=1,
        input="{}",
        state_bag="{}",
        state_bag_sequence=None,
        error=None,
        tenant_id=None,
        idempotency_key=None,
        correlation_id=None,
        deadline_at=None,
        parent_instance_id=None,
        parent_scope=None,
        parent_step_id=None,
        resume_count=0,
        codec_version=1,
        created_at=T0,
        updated_at=T0,
    )
    return replace(row, **fields)
