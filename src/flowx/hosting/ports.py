"""The engine's ports, bound to a node's context and one run's lease (R2.4).

An ``Execution`` commits and waits through these; each is built for one run and holds only
what that run may use: the node's context (stores, clock, outbox) and the lease whose token
fences its writes. Starting and undoing sub-flow children is the runner's business, reached
through the small ``Children`` protocol so that this module does not import the runner.
"""

from __future__ import annotations

import time
from typing import Protocol

from pydantic import BaseModel

from flowx.errors import FlowXError
from flowx.hosting.context import NodeContext
from flowx.hosting.lease import DurableLease
from flowx.metrics import STEP_COMMIT_SECONDS, STEP_COMMITS
from flowx.plan.model import Plan, SubFlowNode
from flowx.stores.records import (
    EventWrite,
    InstanceRecord,
    InstanceState,
    Outcome,
    SignalRecord,
    StepCommit,
    StepWrite,
    SuspendCommit,
    Wake,
    blank,
)

#: Read once: on CPython 3.11 each read of an enum class's member passes through its
#: metaclass's ``__getattr__`` hook (a few times a dict lookup), and this is the step path.
_SUCCESS = Outcome.SUCCESS


class Children(Protocol):
    """Starts and undoes sub-flow children: the runner, which runs every instance."""

    async def start_child(
        self,
        plan: Plan,
        value: BaseModel,
        instance_id: str,
        *,
        parent: InstanceRecord,
        scope: str,
        node: SubFlowNode,
    ) -> None: ...

    async def undo_child(self, child_id: str) -> None: ...


class DurableCommitter:
    """Binds the engine's commits to a journal, under a live lease's token (R2.4), and
    measures them: the one seam every step row of this node passes (``flowx.metrics``).

    The run's ``committer`` port is the bound method ``commit``, not the object: an object
    called with keyword arguments goes through ``__call__`` by way of a dict CPython 3.11
    packs them into (0.42 against 0.08 µs a call), and this is called on every step."""

    def __init__(
        self, ctx: NodeContext, instance_id: str, lease: DurableLease, flow_id: str
    ) -> None:
        self._ctx = ctx
        self._instance_id = instance_id
        self._lease = lease
        self._flow_id = flow_id
        self._latency = STEP_COMMIT_SECONDS.child(flow_id)
        self._success = STEP_COMMITS.child((flow_id, Outcome.SUCCESS.value))

    async def commit(
        self,
        *,
        step: StepWrite | None = None,
        state_bag: str | None = None,
        state: InstanceState | None = None,
        error: str | None = None,
        events: tuple[EventWrite, ...] = (),
        notify_parent: bool = False,
    ) -> None:
        stores = self._ctx.require_stores()
        # A terminal commit ends the lease in its own write where the journal keeps the
        # leases: the run then releases nothing afterwards (one round trip a flow fewer).
        release = state is not None and state.terminal and self._ctx.commit_releases
        commit = blank(StepCommit)  # one per step: built as ``blank`` says, without a dict
        StepCommit.__init__(
            commit,
            instance_id=self._instance_id,
            # The token this run holds, live or not: a finished step's effect is done, and
            # the journal's fence, not this node's view of its lease, decides (R2.4).
            token=self._lease.fence_token,
            now=self._ctx.clock.store_time(),
            step=step,
            state_bag=state_bag,
            state=state,
            error=error,
            events=events,
            notify_parent=notify_parent,
            release_lease=release,
        )
        # Marked under way for the lease (``DurableLease.writing``, inlined: every step).
        writes = self._lease.writes
        started = writes[id(commit)] = time.monotonic()
        try:
            await stores.journal.commit(commit)
        finally:
            del writes[id(commit)]
        if step is not None:
            self._latency.observe(time.monotonic() - started)
            if step.outcome is _SUCCESS:
                self._success.inc()
            else:
                STEP_COMMITS.child((self._flow_id, step.outcome.value)).inc()
        if release:
            await self._lease.ended_by_commit()
        if events and self._ctx.outbox is not None:
            self._ctx.outbox.wake()


class DurableWaits:
    """Binds the engine's waits to the stores, under the run's lease (R2.4)."""

    def __init__(
        self,
        ctx: NodeContext,
        record: InstanceRecord,
        lease: DurableLease,
        children: Children,
        *,
        inbox: tuple[SignalRecord, ...] | None = None,
    ) -> None:
        self._ctx = ctx
        self._record = record
        self._lease = lease
        self._children = children
        # The inbox of the awaited name as the claim read it, under this lease: used for the
        # first look only. A signal delivered after that read is not lost — the seal refuses
        # while one waits unconsumed, and the run then reads the inbox from the store.
        self._inbox = inbox

    async def signals(self, name: str) -> list[SignalRecord]:
        inbox, self._inbox = self._inbox, None
        if inbox is not None and name == self._record.wake_signal:
            return list(inbox)
        waits = self._ctx.require_stores().waits
        return list(await waits.signals(self._record.instance_id, name))

    async def suspend(
        self, wake: Wake, *, state_bag: str, consumed: tuple[int, ...], child: str | None
    ) -> bool:
        waits = self._ctx.require_stores().waits
        commit = SuspendCommit(
            instance_id=self._record.instance_id,
            token=self._lease.fence_token,  # the journal's fence decides (R2.4)
            now=self._ctx.clock.now(),
            wake=wake,
            state_bag=state_bag,
            consumed=consumed,
            child=child,
        )
        with self._lease.writing():
            return await waits.suspend(commit)

    async def child(self, instance_id: str) -> InstanceRecord | None:
        return await self._ctx.require_stores().journal.get(instance_id)

    async def start_child(
        self, node: SubFlowNode, child_id: str, input_value: BaseModel, scope: str
    ) -> None:
        assert node.plan is not None  # nosec B101  # invariant: build() sets a sub-flow's plan
        await self._children.start_child(
            node.plan, input_value, child_id, parent=self._record, scope=scope, node=node
        )

    async def compensate_child(self, child_id: str) -> None:
        # A child whose lease is held (its own undo resumed on a peer, a release that did not
        # land) is busy, not failed: wait for it without spending the compensation's budget,
        # for as long as this run may still write.
        delay = 0.2
        while True:
            try:
                await self._children.undo_child(child_id)
                return
            except FlowXError as exc:
                if exc.code != "sub_flow.child_busy":
                    raise
            self._lease.check()  # raises LeaseLost once this run may not write
            await self._ctx.clock.sleep(delay)
            delay = min(delay * 2, 5.0)


class EphemeralCommitter:
    """Ephemeral runs commit to nothing: the same loop, no journal (its port is ``commit``,
    as ``DurableCommitter``'s is)."""

    async def commit(
        self,
        *,
        step: StepWrite | None = None,
        state_bag: str | None = None,
        state: InstanceState | None = None,
        error: str | None = None,
        events: tuple[EventWrite, ...] = (),
        notify_parent: bool = False,
    ) -> None:
        return None
