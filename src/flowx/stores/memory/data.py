"""The memory store's data set: the dicts every role of it reads and writes.

In a module of its own so that the journal, the leases and the waits (``store.py``,
``waits.py``) each import it and none imports another for it.
"""

from __future__ import annotations

from datetime import timedelta

from flowx.stores.errors import FencedOut, UnknownInstance
from flowx.stores.records import (
    EventRecord,
    InstanceRecord,
    Lease,
    RecoveryCandidate,
    SignalRecord,
    StepRecord,
)


class MemoryData:
    """One in-memory data set, shared by every role of one ``MemoryStores``."""

    def __init__(self) -> None:
        self.instances: dict[str, InstanceRecord] = {}
        self.keys: dict[tuple[str, str], str] = {}
        self.steps: dict[str, list[StepRecord]] = {}
        self.step_keys: set[tuple[str, str, int, int]] = set()
        self.events: list[EventRecord] = []
        self.leases: dict[str, Lease] = {}
        self.staged_seq = 0
        self.signals: list[SignalRecord] = []
        self.signal_seq = 0
        #: Each declared change consumer's cursor (its last ``staged_seq`` read).
        self.cursors: dict[str, int] = {}
        #: ``retention_policy``, seeded as the SQL migrations seed it (R2.13).
        self.policies: dict[tuple[str, str], timedelta | None] = {
            ("*", "Completed"): timedelta(days=30),
            ("*", "Failed"): timedelta(days=180),
            ("*", "Suspended"): None,
            ("*", "OutboxPublished"): timedelta(days=7),
        }

    def fenced(self, instance_id: str, token: int) -> InstanceRecord:
        """The instance a write under ``token`` may change; ``UnknownInstance`` or
        ``FencedOut`` (R2.4) if there is none or the token is below its fence."""
        record = self.instances.get(instance_id)
        if record is None:
            raise UnknownInstance(instance_id)
        if token < record.fence:
            raise FencedOut(instance_id, token, record.fence)
        return record


def candidate(record: InstanceRecord) -> RecoveryCandidate:
    """What the recovery scan and the timer return of an instance."""
    return RecoveryCandidate(
        instance_id=record.instance_id,
        flow_id=record.flow_id,
        flow_version=record.flow_version,
        state=record.state,
        updated_at=record.updated_at,
    )
