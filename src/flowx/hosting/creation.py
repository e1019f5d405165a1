"""The rows a start writes: a new instance, or a sub-flow's child (R3.3, R4.1).

Kept apart from the runner because they are pure derivations from a plan, an input and the
clock: the instance id from an idempotency key, the tenant, the deadline (never past a
parent's), the state a new row starts in.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from flowx import codec
from flowx.errors import InputInvalid, SerialisationError
from flowx.hosting.storable import partition_of, start_input, start_keys, tenant_key
from flowx.plan.model import Plan, SubFlowNode
from flowx.sealing import Sealing
from flowx.stores.placement import ShardedIds
from flowx.stores.records import InstanceRecord, InstanceState, NewInstance
from flowx.tracing import current_context
from flowx.validation import field_errors, problems

if TYPE_CHECKING:
    from flowx.hosting.context import NodeContext

#: Instance ids from idempotency keys are derived, so two racing starts contend for one lease.
INSTANCE_NAMESPACE = uuid.UUID("b3c1f0d2-8a4e-4f6b-9c2d-1e7a5b9f3c40")


def instance_id_for(plan: Plan, idempotency_key: str | None) -> str:
    """Derived from the key when there is one (racing starts meet on one id), else random."""
    if idempotency_key is None:
        return str(uuid.uuid4())
    return str(uuid.uuid5(INSTANCE_NAMESPACE, f"{plan.flow_id}\x00{idempotency_key}"))


async def find_started(
    ctx: NodeContext, flow_id: str, idempotency_key: str, instance_id: str
) -> InstanceRecord | None:
    """The instance an earlier start with this key made, if any (R4.1). On a sharded store
    (ids placed) it is the one with the derived id, on the tenant's shard: asked there alone,
    so one shard down refuses no start on the others (R6.2). An idempotency key is then unique
    per tenant. Any other store is asked by key."""
    stores = ctx.require_stores()
    if ctx.placement is not None:
        return await stores.journal.get(instance_id)
    return await stores.journal.find_by_key(flow_id, idempotency_key)


def started_input(
    plan: Plan,
    value: BaseModel,
    sealing_of: Callable[[str], Sealing | None],
    *,
    idempotency_key: str | None,
    correlation_id: str | None,
    store: ShardedIds | None = None,
) -> tuple[str, str]:
    """A start's instance id and its input's stored text, sealed under that id (R9.8). The
    keys are checked first: the id is derived from the idempotency key. A sharded store
    (``ShardedIds``) places the id on its tenant's shard first (R6.2): the same key and tenant
    always meet on one id, on one shard."""
    start_keys(plan, idempotency_key=idempotency_key, correlation_id=correlation_id)
    instance_id = instance_id_for(plan, idempotency_key)
    if store is not None:
        instance_id = store.place(instance_id, tenant_key(plan, partition_of(plan, value)))
    with codec.sealing(sealing_of(instance_id)):
        text = start_input(plan, value)
    return instance_id, text


def new_instance(
    plan: Plan,
    value: BaseModel,
    input_text: str,
    *,
    instance_id: str,
    idempotency_key: str | None,
    correlation_id: str | None,
    run_here: bool,
    now: datetime,
) -> NewInstance:
    """The row of an instance started by a caller."""
    return NewInstance(
        instance_id=instance_id,
        flow_id=plan.flow_id,
        flow_version=plan.version,
        input=input_text,
        state_bag=codec.dumps(plan.state_model(), root="state"),
        state=InstanceState.RUNNING if run_here else InstanceState.PENDING,
        tenant_id=tenant_key(plan, partition_of(plan, value)),
        idempotency_key=idempotency_key,
        correlation_id=correlation_id,
        deadline_at=now + plan.deadline if plan.deadline else None,
        codec_version=codec.CODEC_VERSION,
        trace_context=current_context(),
    )


def child_instance(
    plan: Plan,
    value: BaseModel,
    instance_id: str,
    *,
    parent: InstanceRecord,
    scope: str,
    node: SubFlowNode,
    running: bool,
    now: datetime,
) -> NewInstance:
    """The row of a sub-flow's child: its id derived from the parent's step (so a re-executed
    parent finds it), its tenant and correlation the parent's unless its own input says."""
    tenant = partition_of(plan, value)
    try:  # R9.5: refused before anything is written; the parent's sub_flow step fails
        input_text = codec.dumps(value, root="input")
        tenant = tenant_key(plan, tenant)
    except SerialisationError as exc:
        raise InputInvalid(plan.flow_id, str(exc)) from exc
    own = now + plan.deadline if plan.deadline else None
    return NewInstance(
        instance_id=instance_id,
        flow_id=plan.flow_id,
        flow_version=plan.version,
        input=input_text,
        state_bag=codec.dumps(plan.state_model(), root="state"),
        state=InstanceState.RUNNING if running else InstanceState.PENDING,
        tenant_id=parent.tenant_id if tenant is None else str(tenant),
        correlation_id=parent.correlation_id,
        # Never past the parent's: a parent that times out finds its child timed out too.
        deadline_at=min((d for d in (own, parent.deadline_at) if d is not None), default=None),
        parent_instance_id=parent.instance_id,
        parent_scope=scope,
        parent_step_id=node.step_id,
        codec_version=codec.CODEC_VERSION,
        # Started from the parent's run: the same trace (``flowx.tracing``).
        trace_context=current_context() or parent.trace_context,
    )


def validated_input(plan: Plan, value: Any) -> BaseModel:
    """``value`` as the flow's input model; ``InputInvalid`` naming each bad field."""
    model: type[BaseModel] = plan.input_model
    if isinstance(value, model):
        return value
    try:
        if isinstance(value, str | bytes):
            return model.model_validate_json(value)
        return model.model_validate(value)
    except ValidationError as exc:
        raise InputInvalid(plan.flow_id, problems(exc), fields=field_errors(exc)) from exc
