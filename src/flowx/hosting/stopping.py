"""Cancel and terminate on a node (R9.4): the request, and who carries it out.

``FlowHost.cancel``/``terminate`` keep the request in the journal (``StopStore``: on the
instance and every unfinished descendant, in one write), then see that each instance it
reached stops:

* running on this node: its run is told at once (``StopBoard.tell``) and stops at its next
  boundary — an attempt in flight is cut as a step timeout cuts it;
* running on another node: that node reads the request at its next lease renewal
  (``StopBoard.poll``, one read per renewal round for every instance it runs) and does the
  same; a node that dies first leaves it to recovery, which reads it when it re-opens;
* not running (``Pending``, or ``Suspended`` or ``Quarantined`` and so made ``Pending`` by
  the request): a terminate is ended here, under a lease, fenced like any write — it owes no
  compensation, so no flow code runs (a quarantined instance's code may not even match it).
  A cancel is run here if this node carries the flow, and the run stops at its first
  boundary, compensating what had finished; if it does not, the node still ends it when no
  compensation can be owed (no finished step). Otherwise the instance stays ``Pending`` for a
  worker that carries the flow, and the answer says so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from flowx import codec
from flowx.engine.stops import stop_error
from flowx.errors import IllegalState, InstanceNotFound, RequestInvalid
from flowx.hosting.context import NodeContext
from flowx.hosting.lease import DurableLease
from flowx.stores.errors import FencedOut, InstanceFinished, UnknownInstance
from flowx.stores.protocols import Stores
from flowx.stores.records import (
    History,
    InstanceRecord,
    InstanceState,
    Outcome,
    StepCommit,
    StepRecord,
    StopReceipt,
    StopRequest,
)


class Runner(Protocol):
    """What carrying out a stop needs of the node's ``InstanceRunner`` (a protocol, so this
    module and the runner, which calls it back, do not import each other)."""

    async def resume(self, instance_id: str, *, queued: bool = False) -> str: ...

    async def claim(
        self, stores: Stores, record: InstanceRecord
    ) -> tuple[DurableLease, History] | None: ...


log = logging.getLogger("flowx.host")

#: The longest reason kept; a reason is for a person, not a payload.
MAX_REASON = 1000


@dataclass(frozen=True, kw_only=True, slots=True)
class StopOutcome:
    """What ``FlowHost.cancel``/``terminate`` did.

    ``status``: ``requested`` (kept now), ``already`` (an equal or stronger request was
    kept before) or ``ended`` (the instance had already ended by a stop). ``state``: the
    instance's state once this node did its part. ``waiting``: instances (this one or a
    descendant) left ``Pending`` for a worker that carries their flow, which owes them a
    compensation this node cannot run."""

    instance_id: str
    mode: str
    status: str
    state: InstanceState
    reached: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()


def request_of(mode: str, reason: str, by: str, ctx: NodeContext) -> StopRequest:
    """A request, or ``RequestInvalid`` naming what is wrong with it."""
    reason = reason.strip()
    if not reason:
        raise RequestInvalid(
            f"a {mode} needs a reason (whoever reads the history later needs to know why); "
            "pass --reason"
        )
    if len(reason) > MAX_REASON:
        raise RequestInvalid(f"the reason is {len(reason)} characters; keep it under {MAX_REASON}")
    by = by.strip() or ctx.node_id
    codec.dumps({"reason": reason, "by": by}, root="stop request")  # R9.5: storable text
    return StopRequest(mode=mode, reason=reason, by=by, at=ctx.clock.now())


async def stop(
    ctx: NodeContext, runner: Runner, instance_id: str, request: StopRequest
) -> StopOutcome:
    """Keep ``request`` and see that every instance it reached stops (module docstring)."""
    stores = ctx.require_stores()
    try:
        receipt = await stores.stops.request_stop(instance_id, request)
    except UnknownInstance as exc:
        raise InstanceNotFound(instance_id) from exc
    except InstanceFinished as exc:
        raise IllegalState(
            f"instance {instance_id} has already ended ({exc.state}); there is nothing to "
            f"{request.mode}. `flowx show {instance_id}` gives its history"
        ) from exc
    waiting: list[str] = []
    for iid, state in receipt.affected:
        if ctx.stops.tell(iid, request):
            continue  # running here: its run stops at its next boundary
        if state is not InstanceState.PENDING and request.mode != "terminate":
            continue  # running elsewhere: that node's run stops it
        # Pending: stop it here. A terminate also tries a Running one: if the node that ran
        # it died and no live node carries its version, nobody else ever would (the lease
        # is taken only if it has expired).
        if not await _carry_out(ctx, runner, stores, iid):
            waiting.append(iid)
    record = await stores.journal.get(instance_id)
    return _outcome(receipt, record, waiting)


def _outcome(
    receipt: StopReceipt, record: InstanceRecord | None, waiting: list[str]
) -> StopOutcome:
    return StopOutcome(
        instance_id=receipt.instance_id,
        mode=receipt.mode,
        status=receipt.status,
        state=record.state if record is not None else receipt.state,
        reached=tuple(i for i, _ in receipt.affected),
        waiting=tuple(waiting),
    )


async def _carry_out(ctx: NodeContext, runner: Runner, stores: Stores, instance_id: str) -> bool:
    """Stop a ``Pending`` instance on this node: run it (it stops at once) if this node
    carries its flow, else end it here if no compensation can be owed. ``False``: left for
    a worker that carries the flow."""
    record = await stores.journal.get(instance_id)
    if record is None or record.state.terminal:
        return True
    terminate = record.stop_request is not None and (
        StopRequest.loads(record.stop_request).mode == "terminate"
    )
    if not terminate and ctx.accepting and ctx.plans.carries(record.flow_id, record.flow_version):
        verdict = await runner.resume(instance_id, queued=True)
        return verdict != "not_runnable"
    if _owes_compensation(record, await stores.journal.steps(instance_id)):
        return False  # compensation needs the flow's code: a worker that carries it
    try:
        claimed = await runner.claim(stores, record)
    except (FencedOut, UnknownInstance):
        return True  # another node took it: its run reads the request when it opens it
    if claimed is None:
        return True  # held elsewhere: that node stops it
    lease, history = claimed
    try:
        current = history.instance
        if current.state.terminal:
            return True
        if current.stop_request is None:
            return True
        request = StopRequest.loads(current.stop_request)
        if _owes_compensation(current, history.steps):
            # It ran between the read above and this lease: hand it back as it was found.
            await stores.journal.commit(
                StepCommit(
                    instance_id=instance_id,
                    token=lease.token,
                    now=ctx.clock.store_time(),
                    state=InstanceState.PENDING,
                )
            )
            return False
        final = InstanceState.CANCELLED if request.mode == "cancel" else InstanceState.TERMINATED
        await stores.journal.commit(
            StepCommit(
                instance_id=instance_id,
                token=lease.token,
                now=ctx.clock.store_time(),
                state=final,
                error=codec.dumps(stop_error(request)),
                notify_parent=current.parent_instance_id is not None,
            )
        )
        log.info("instance %s %s by %s: %s", instance_id, final.value, request.by, request.reason)
        return True
    finally:
        await lease.release()


def _owes_compensation(record: InstanceRecord, steps: Sequence[StepRecord]) -> bool:
    """A cancel of an instance with a finished step may owe a compensation, which only the
    flow's code can run; a terminate owes none."""
    request = StopRequest.loads(record.stop_request) if record.stop_request else None
    return (
        request is not None
        and request.mode == "cancel"
        and any(s.outcome is Outcome.SUCCESS for s in steps)
    )
