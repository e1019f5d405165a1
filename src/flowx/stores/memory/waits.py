"""``WaitStore`` in memory: suspend, signal, the timer's due list, and replay (R2.10, R2.11).

Over the same dicts as the rest of the memory store (``MemoryData``); kept in a module of its own,
as the SQLite and PostgreSQL stores keep theirs. Each method is atomic because it never
awaits: that is this store's lock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime

from flowx.stores.errors import InstanceFinished, UnknownInstance
from flowx.stores.memory.data import MemoryData, candidate
from flowx.stores.records import (
    InstanceRecord,
    InstanceState,
    RecoveryCandidate,
    SignalReceipt,
    SignalRecord,
    SuspendCommit,
)


class MemoryWaits:
    """``WaitStore`` over the same dicts; each method is atomic because it never awaits."""

    def __init__(self, data: MemoryData) -> None:
        self._d = data

    async def suspend(self, commit: SuspendCommit) -> bool:
        record = self._d.fenced(commit.instance_id, commit.token)
        wake = commit.wake
        if wake.signal is not None and any(
            s.instance_id == commit.instance_id
            and s.name == wake.signal
            and s.seq not in commit.consumed
            for s in self._d.signals
        ):
            return False
        if commit.child is not None:
            child = self._d.instances.get(commit.child)
            if child is not None and child.state.terminal:
                return False
        self._d.instances[commit.instance_id] = dataclasses.replace(
            record,
            state=InstanceState.SUSPENDED if record.stop_request is None else InstanceState.PENDING,
            wake_at=wake.at,
            wake_step_id=wake.step_id,
            wake_scope=wake.scope,
            wake_signal=wake.signal,
            state_bag=commit.state_bag if commit.state_bag is not None else record.state_bag,
            updated_at=commit.now,
        )
        return True

    async def signal(
        self,
        instance_id: str,
        name: str,
        payload: str,
        *,
        key: str | None,
        now: datetime,
        limit: int | None = None,
    ) -> SignalReceipt:
        d = self._d
        record = d.instances.get(instance_id)
        if record is None:
            raise UnknownInstance(instance_id)
        inbox = [s for s in d.signals if (s.instance_id, s.name) == (instance_id, name)]
        # R2.10, in this order and with no await in between: a redelivery (even after the
        # end), an ended instance, then a wait that happens once already spoken for.
        seen = next((s.seq for s in inbox if key is not None and s.key == key), None)
        if seen is None and record.state.terminal:
            raise InstanceFinished(instance_id, record.state.value)
        if seen is None and limit is not None and len(inbox) >= limit:
            seen = inbox[-1].seq if inbox else 0
        if seen is not None:
            return SignalReceipt(
                instance_id=instance_id,
                name=name,
                seq=seen,
                status="duplicate",
                state=record.state,
            )
        d.signal_seq += 1
        d.signals.append(
            SignalRecord(
                instance_id=instance_id,
                name=name,
                seq=d.signal_seq,
                key=key,
                payload=payload,
                received_at=now,
            )
        )
        woken = record.state is InstanceState.SUSPENDED and record.wake_signal == name
        if woken:
            record = dataclasses.replace(record, state=InstanceState.PENDING, updated_at=now)
            d.instances[instance_id] = record
        return SignalReceipt(
            instance_id=instance_id,
            name=name,
            seq=d.signal_seq,
            status="woken" if woken else "kept",
            state=record.state,
        )

    async def signals(self, instance_id: str, name: str) -> Sequence[SignalRecord]:
        return tuple(s for s in self._d.signals if s.instance_id == instance_id and s.name == name)

    def _suspended_with_timer(self) -> list[InstanceRecord]:
        return [
            r
            for r in self._d.instances.values()
            if r.state is InstanceState.SUSPENDED and r.wake_at is not None
        ]

    async def find_due(
        self, *, now: datetime, limit: int, flows: Sequence[str] | None = None
    ) -> Sequence[RecoveryCandidate]:
        carried = None if flows is None else set(flows)
        due = [
            r
            for r in self._suspended_with_timer()
            if r.wake_at is not None
            and r.wake_at <= now
            and (carried is None or f"{r.flow_id}@{r.flow_version}" in carried)
        ]
        due.sort(key=lambda r: (r.wake_at, r.instance_id))
        return tuple(candidate(r) for r in due[:limit])

    async def next_wake(self, *, flows: Sequence[str] | None = None) -> datetime | None:
        carried = None if flows is None else set(flows)
        return min(
            (
                r.wake_at
                for r in self._suspended_with_timer()
                if r.wake_at is not None
                and (carried is None or f"{r.flow_id}@{r.flow_version}" in carried)
            ),
            default=None,
        )

    async def rearm(
        self,
        instance_id: str,
        *,
        token: int,
        now: datetime,
        from_step: int,
        rerun_from: int | None = None,
        deadline: datetime | None = None,
        resume: bool = False,
    ) -> InstanceRecord:
        record = self._d.fenced(instance_id, token)
        record = dataclasses.replace(
            record,
            state=InstanceState.PENDING,
            replay_sequence=record.replay_sequence if resume else record.next_sequence,
            resume_from_step=from_step,
            replay_from=record.replay_from if resume else rerun_from,
            stop_request=record.stop_request if rerun_from is None else None,
            deadline_at=deadline or record.deadline_at,
            resume_count=0,
            updated_at=now,
        )
        if rerun_from is not None:
            record = dataclasses.replace(
                record, wake_at=None, wake_step_id=None, wake_scope=None, wake_signal=None
            )
        self._d.instances[instance_id] = record
        return record
