"""Quarantine: an instance whose journal no longer matches its plan is set aside, once.

A plan changed under the same version (a step renamed, removed, moved) or a pinned
capability version this node no longer carries makes a resume raise ``NonDeterminismError``.
Retrying cannot help — every node that carries the version would fail the same way, on every
recovery sweep, logging it each time — and running on would redo or skip effects. So the node
that found it writes the instance ``Quarantined`` under its lease, with the reason as its
error: visible (``flowx list --state Quarantined``), not ended (retention keeps it, nothing
is compensated), and not active (recovery passes it by). Once the right code runs — the old
version deployed beside the new one, or the plan fixed — ``flowx replay`` puts it back.
"""

from __future__ import annotations

import logging

from flowx import codec
from flowx.engine.failures import error_payload
from flowx.engine.stops import stop_error
from flowx.errors import FlowXError, NonDeterminismError
from flowx.hosting.context import NodeContext
from flowx.hosting.lease import DurableLease
from flowx.stores.records import InstanceRecord, InstanceState, StepCommit, StopRequest

log = logging.getLogger("flowx.host")


async def quarantine(
    ctx: NodeContext, lease: DurableLease, record: InstanceRecord, exc: NonDeterminismError
) -> None:
    """Write ``record``'s instance ``Quarantined`` under ``lease`` (fenced), with ``exc`` as
    its error; logged once, here. A write that fails leaves it to recovery, as before."""
    iid = record.instance_id
    error = {
        **error_payload(exc, retryable=False),
        "flow": f"{record.flow_id}@{record.flow_version}",
        "node": ctx.node_id,
    }
    try:
        await ctx.require_stores().journal.commit(
            StepCommit(
                instance_id=iid,
                token=lease.token,
                now=ctx.clock.store_time(),
                state=InstanceState.QUARANTINED,
                error=codec.dumps(error),
            )
        )
    except FlowXError as failed:
        log.error(
            "instance %s cannot be resumed (%s), and setting it aside failed (%s); recovery "
            "will try it again",
            iid,
            exc,
            failed,
        )
        return
    await _terminate_if_asked(ctx, lease, iid)
    log.error(
        "instance %s of %s@%s quarantined: %s. Run the code it was started with, then "
        "`flowx replay %s`",
        iid,
        record.flow_id,
        record.flow_version,
        exc,
        iid,
    )


async def _terminate_if_asked(ctx: NodeContext, lease: DurableLease, iid: str) -> None:
    """A terminate that came while the instance was being set aside is carried out now,
    under the same lease: it needs none of the flow's code. (A cancel waits: compensating
    needs the code that matches the journal.)"""
    stores = ctx.require_stores()
    record = await stores.journal.get(iid)
    if record is None or record.stop_request is None:
        return
    request = StopRequest.loads(record.stop_request)
    if request.mode != "terminate":
        return
    await stores.journal.commit(
        StepCommit(
            instance_id=iid,
            token=lease.token,
            now=ctx.clock.store_time(),
            state=InstanceState.TERMINATED,
            error=codec.dumps(stop_error(request)),
            notify_parent=record.parent_instance_id is not None,
        )
    )
    log.info("instance %s terminated by %s: %s", iid, request.by, request.reason)
