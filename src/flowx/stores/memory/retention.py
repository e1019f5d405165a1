"""``RetentionStore`` in memory (R2.13), over the shared dicts; atomic because no method
awaits."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from flowx.stores.memory.data import MemoryData
from flowx.stores.records import (
    ArchivedInstance,
    ExpiredInstance,
    InstanceRecord,
    InstanceState,
    RetentionPolicy,
)
from flowx.stores.retention import PARENT_KEPT, UNPUBLISHED, UNREAD


class MemoryRetention:
    """``RetentionStore`` over the same dicts as the rest of the memory store."""

    def __init__(self, data: MemoryData) -> None:
        self._d = data

    async def policies(self) -> Sequence[RetentionPolicy]:
        return tuple(
            RetentionPolicy(flow_id=f, state_class=c, retain_for=r)
            for (f, c), r in sorted(self._d.policies.items())
        )

    async def set_policy(self, policy: RetentionPolicy) -> None:
        self._d.policies[(policy.flow_id, policy.state_class)] = policy.retain_for

    def _held_by(self, record: InstanceRecord) -> str | None:
        d = self._d
        read_to = min(d.cursors.values(), default=None)
        mine = [e for e in d.events if e.instance_id == record.instance_id]
        if any(e.published_at is None for e in mine):
            return UNPUBLISHED
        if read_to is not None and any(e.staged_seq > read_to for e in mine):
            return UNREAD
        if record.parent_instance_id in d.instances:
            return PARENT_KEPT
        return None

    async def expired(
        self,
        *,
        flow_id: str | None,
        states: Sequence[InstanceState],
        ended_before: datetime,
        skip_flows: Sequence[str] = (),
        after: tuple[datetime, str] | None = None,
        limit: int,
    ) -> Sequence[ExpiredInstance]:
        found = sorted(
            (
                r
                for r in self._d.instances.values()
                if r.state in states
                and r.updated_at < ended_before
                and (r.flow_id == flow_id if flow_id is not None else r.flow_id not in skip_flows)
                and (after is None or (r.updated_at, r.instance_id) > after)
            ),
            key=lambda r: (r.updated_at, r.instance_id),
        )[:limit]
        return tuple(
            ExpiredInstance(
                instance_id=r.instance_id,
                flow_id=r.flow_id,
                state=r.state,
                updated_at=r.updated_at,
                held_by=self._held_by(r),
            )
            for r in found
        )

    async def contents(self, instance_ids: Sequence[str]) -> Sequence[ArchivedInstance]:
        d = self._d
        return tuple(
            ArchivedInstance(
                instance=d.instances[iid],
                steps=tuple(d.steps.get(iid, ())),
                signals=tuple(s for s in d.signals if s.instance_id == iid),
                events=tuple(e for e in d.events if e.instance_id == iid),
            )
            for iid in instance_ids
            if iid in d.instances
        )

    async def delete(self, expired: Sequence[ExpiredInstance]) -> int:
        d = self._d
        gone: set[str] = set()
        for item in expired:
            record = d.instances.get(item.instance_id)
            if (
                record is None
                or not record.state.terminal
                or record.updated_at != item.updated_at
                or self._held_by(record) is not None
            ):
                continue
            gone.add(item.instance_id)
            del d.instances[item.instance_id]
            if record.idempotency_key is not None:
                d.keys.pop((record.flow_id, record.idempotency_key), None)
            for step in d.steps.pop(item.instance_id, []):
                d.step_keys.discard((step.instance_id, step.scope, step.step_id, step.attempt))
            d.leases.pop(item.instance_id, None)
        d.signals = [s for s in d.signals if s.instance_id not in gone]
        d.events = [e for e in d.events if e.instance_id not in gone]
        return len(gone)
