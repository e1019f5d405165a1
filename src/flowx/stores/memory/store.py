"""An in-memory journal, lease store and recovery index, for tests of the engine.

It keeps nothing across a process and is not shared between processes. It is held to the same
conformance suite as every real store, so it cannot drift into a different meaning.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta

from flowx.clock import or_process_now
from flowx.stores.catalog import matches
from flowx.stores.errors import (
    DuplicateStep,
    LeaseLost,
    UnknownConsumer,
)
from flowx.stores.memory.data import MemoryData, candidate
from flowx.stores.memory.retention import MemoryRetention
from flowx.stores.memory.stops import MemoryStops
from flowx.stores.memory.waits import MemoryWaits
from flowx.stores.outbox_claims import ClaimOutcome
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import (
    ACTIVE_STATES,
    CHILD_WAIT,
    ChangeBatch,
    CreateResult,
    EventRecord,
    History,
    InstanceRecord,
    InstanceState,
    Lease,
    NewInstance,
    OutboxBacklog,
    OutboxPurge,
    RecoveryCandidate,
    StepCommit,
    StepRecord,
)


class MemoryJournal:
    """``FlowJournal`` over dicts. Each method is atomic because it never awaits midway."""

    def __init__(self, data: MemoryData) -> None:
        self._d = data

    async def create(
        self, instance: NewInstance, *, token: int, now: datetime | None
    ) -> CreateResult:
        return self.create_now(instance, token=token, now=now)

    def create_now(
        self, instance: NewInstance, *, token: int, now: datetime | None
    ) -> CreateResult:
        """``create``, without an await: ``MemoryStores.create_leased`` runs it in the same
        step as the lease, which is what makes the two one write here."""
        now = or_process_now(now)
        d = self._d
        existing = d.instances.get(instance.instance_id)
        if existing is None and instance.idempotency_key is not None:
            key_owner = d.keys.get((instance.flow_id, instance.idempotency_key))
            existing = d.instances.get(key_owner) if key_owner else None
        if existing is not None:
            return CreateResult(instance=existing, created=False)
        record = InstanceRecord(
            **{f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)},
            fence=token,
            next_sequence=1,
            state_bag_sequence=None,
            error=None,
            resume_count=0,
            created_at=now,
            updated_at=now,
        )
        d.instances[record.instance_id] = record
        d.steps[record.instance_id] = []
        if instance.idempotency_key is not None:
            d.keys[(instance.flow_id, instance.idempotency_key)] = record.instance_id
        return CreateResult(instance=record, created=True)

    async def open(self, instance_id: str, *, token: int, now: datetime | None) -> History:
        now = or_process_now(now)
        record = self._d.fenced(instance_id, token)
        woken = record.state in (InstanceState.PENDING, InstanceState.SUSPENDED)
        state = InstanceState.RUNNING if woken else record.state
        record = dataclasses.replace(
            record, fence=token, resume_count=record.resume_count + 1, state=state, updated_at=now
        )
        self._d.instances[instance_id] = record
        return History(instance=record, steps=tuple(self._d.steps[instance_id]))

    async def commit(self, commit: StepCommit) -> int | None:
        d = self._d
        record = d.fenced(commit.instance_id, commit.token)
        now = or_process_now(commit.now)
        sequence: int | None = None
        step = commit.step
        if step is not None:
            key = (commit.instance_id, step.scope, step.step_id, step.attempt)
            if key in d.step_keys:
                raise DuplicateStep(*key)
            sequence = record.next_sequence
        # Validation done: from here on nothing can fail, so the commit is all-or-nothing.
        changes: dict[str, object] = {"updated_at": now}
        if step is not None and sequence is not None:
            d.step_keys.add((commit.instance_id, step.scope, step.step_id, step.attempt))
            d.steps[commit.instance_id].append(
                StepRecord(
                    instance_id=commit.instance_id,
                    sequence=sequence,
                    committed_at=now,
                    **{f.name: getattr(step, f.name) for f in dataclasses.fields(step)},
                )
            )
            changes["next_sequence"] = sequence + 1
            changes["resume_count"] = 0
            for ordinal, event in enumerate(commit.events):
                d.staged_seq += 1
                d.events.append(
                    EventRecord(
                        event_id=event.event_id,
                        instance_id=commit.instance_id,
                        sequence=sequence,
                        ordinal=ordinal,
                        staged_seq=d.staged_seq,
                        type=event.type,
                        schema_version=event.schema_version,
                        partition_key=event.partition_key,
                        payload=event.payload,
                        published_at=None,
                        staged_at=now,
                        trace_context=event.trace_context,
                    )
                )
        if commit.state_bag is not None:
            changes["state_bag"] = commit.state_bag
            if sequence is not None:
                changes["state_bag_sequence"] = sequence
        if commit.state is not None:
            changes["state"] = commit.state
        if commit.error is not None:
            changes["error"] = commit.error
        record = dataclasses.replace(record, **changes)  # type: ignore[arg-type]
        d.instances[commit.instance_id] = record
        if commit.notify_parent:
            self._wake_parent(record, now)
        if commit.release_lease:
            lease = d.leases.get(commit.instance_id)
            if lease is not None and lease.token == commit.token and lease.expires_at > now:
                d.leases[commit.instance_id] = dataclasses.replace(lease, expires_at=now)
        return sequence

    def _wake_parent(self, child: InstanceRecord, now: datetime) -> None:
        """The parent waits for this child (same step and scope): make it Pending."""
        if child.parent_instance_id is None:
            return
        parent = self._d.instances.get(child.parent_instance_id)
        if (
            parent is not None
            and parent.state is InstanceState.SUSPENDED
            and parent.wake_signal == CHILD_WAIT
            and parent.wake_step_id is not None
            and parent.wake_step_id == child.parent_step_id
            and parent.wake_scope is not None
            and parent.wake_scope == child.parent_scope
        ):
            self._d.instances[parent.instance_id] = dataclasses.replace(
                parent, state=InstanceState.PENDING, updated_at=now
            )

    async def get(self, instance_id: str) -> InstanceRecord | None:
        return self._d.instances.get(instance_id)

    async def find_by_key(self, flow_id: str, idempotency_key: str) -> InstanceRecord | None:
        owner = self._d.keys.get((flow_id, idempotency_key))
        return self._d.instances.get(owner) if owner else None

    async def steps(self, instance_id: str) -> Sequence[StepRecord]:
        return tuple(self._d.steps.get(instance_id, ()))

    async def events(self, instance_id: str) -> Sequence[EventRecord]:
        return tuple(e for e in self._d.events if e.instance_id == instance_id)


class MemoryLeaseStore:
    """``LeaseStore`` over a dict. The row is replaced, never removed, so tokens never restart."""

    def __init__(self, data: MemoryData) -> None:
        self._d = data

    async def acquire(
        self,
        instance_id: str,
        *,
        owner: str,
        ttl: timedelta,
        now: datetime | None,
        floor: int = 0,
    ) -> Lease | None:
        record = self._d.instances.get(instance_id)
        fence = record.fence if record is not None else 0
        lease = self.grant(instance_id, owner=owner, ttl=ttl, now=now, floor=max(floor, fence))
        if lease is not None and record is not None:
            # The fence rises on acquisition (R2.4): from here on a zombie holding an older
            # token is refused, before the new owner has written or even read anything.
            self._d.instances[instance_id] = dataclasses.replace(record, fence=lease.token)
        return lease

    def grant(
        self, instance_id: str, *, owner: str, ttl: timedelta, now: datetime | None, floor: int
    ) -> Lease | None:
        """The lease row alone: granted above ``floor`` if free or expired, else ``None``."""
        now = or_process_now(now)
        current = self._d.leases.get(instance_id)
        if current is not None and current.expires_at > now:
            return None
        last = current.token if current is not None else 0
        lease = Lease(
            instance_id=instance_id, owner=owner, token=max(last, floor) + 1, expires_at=now + ttl
        )
        self._d.leases[instance_id] = lease
        return lease

    async def renew(self, lease: Lease, *, ttl: timedelta, now: datetime | None) -> Lease:
        now = or_process_now(now)
        current = self._d.leases.get(lease.instance_id)
        if current is None or current.token != lease.token:
            raise LeaseLost(lease.instance_id, lease.token, "a newer lease was issued")
        if current.expires_at <= now:
            raise LeaseLost(lease.instance_id, lease.token, "it expired before renewal")
        renewed = dataclasses.replace(current, expires_at=now + ttl)
        self._d.leases[lease.instance_id] = renewed
        return renewed

    async def renew_many(
        self, leases: Sequence[Lease], *, ttl: timedelta, now: datetime | None
    ) -> Sequence[Lease | None]:
        renewed: list[Lease | None] = []
        for lease in leases:
            try:
                renewed.append(await self.renew(lease, ttl=ttl, now=now))
            except LeaseLost:
                renewed.append(None)
        return renewed

    async def release(self, lease: Lease, *, now: datetime | None) -> None:
        now = or_process_now(now)
        current = self._d.leases.get(lease.instance_id)
        if current is not None and current.token == lease.token and current.expires_at > now:
            self._d.leases[lease.instance_id] = dataclasses.replace(current, expires_at=now)

    async def current(self, instance_id: str) -> Lease | None:
        return self._d.leases.get(instance_id)


class MemoryRecoveryIndex:
    """``RecoveryIndex`` by a linear scan: fine for tests, which is all this store is for."""

    def __init__(self, data: MemoryData) -> None:
        self._d = data

    async def find_abandoned(
        self, *, now: datetime | None, idle_for: timedelta, limit: int, offset: int = 0
    ) -> Sequence[RecoveryCandidate]:
        cutoff = or_process_now(now) - idle_for
        found = [
            r
            for r in self._d.instances.values()
            if r.state in ACTIVE_STATES and r.updated_at < cutoff
        ]
        return self._page(found, limit, offset)

    async def find_queued(self, *, limit: int, offset: int = 0) -> Sequence[RecoveryCandidate]:
        found = [r for r in self._d.instances.values() if r.state is InstanceState.PENDING]
        return self._page(found, limit, offset)

    @staticmethod
    def _page(found: list[InstanceRecord], limit: int, offset: int) -> list[RecoveryCandidate]:
        found.sort(key=lambda r: (r.updated_at, r.instance_id))
        return [candidate(r) for r in found[offset : offset + limit]]


class MemoryCatalog:
    """``InstanceCatalog`` over the same dicts."""

    def __init__(self, data: MemoryData) -> None:
        self._d = data

    async def list_instances(self, query: InstanceQuery) -> Sequence[InstanceRecord]:
        rows = [
            r
            for r in self._d.instances.values()
            if matches(r, query)
            and (query.before is None or (r.created_at, r.instance_id) < query.before)
        ]
        rows.sort(key=lambda r: (r.created_at, r.instance_id), reverse=True)
        return rows[: query.limit]

    async def count_instances(self, query: InstanceQuery, *, by: str) -> dict[str, int]:
        found = Counter(
            r.state.value
            if by == "state"
            else r.flow_id
            if by == "flow"
            else f"{r.flow_id}@{r.flow_version}"
            for r in self._d.instances.values()
            if matches(r, query)
        )
        return dict(sorted(found.items()))


class MemoryOutbox:
    """The outbox over the in-memory event list. A claim holds its events in a set until it
    ends; the sibling hold reads the same list, so the rules are the PostgreSQL ones."""

    def __init__(self, data: MemoryData) -> None:
        self._d = data
        self._claimed: set[str] = set()

    @contextlib.asynccontextmanager
    async def claim(
        self, *, limit: int, now: datetime, owner: str, dead_letters_hold_keys: bool = False
    ) -> AsyncIterator[ClaimOutcome]:
        taken: list[EventRecord] = []
        held: set[str] = set()
        for e in self._d.events:
            key = e.partition_key
            if e.published_at is None and e.dead_at is not None:
                if dead_letters_hold_keys and key is not None:
                    held.add(key)
                continue
            if e.published_at is not None:
                continue
            if key is not None and key in held:
                continue
            if e.event_id in self._claimed or len(taken) >= limit:
                if key is not None:
                    held.add(key)
                continue
            taken.append(e)
        ids = {e.event_id for e in taken}
        self._claimed |= ids
        outcome = ClaimOutcome(events=tuple(taken))
        try:
            yield outcome
            self._apply(outcome, now)
        finally:
            self._claimed -= ids

    def _apply(self, outcome: ClaimOutcome, now: datetime) -> None:
        index = {e.event_id: i for i, e in enumerate(self._d.events)}
        for event_id in outcome.published_ids:
            i = index[event_id]
            self._d.events[i] = dataclasses.replace(self._d.events[i], published_at=now)
        for r in outcome.refusals:
            i = index[r.event_id]
            e = self._d.events[i]
            self._d.events[i] = dataclasses.replace(
                e,
                attempts=e.attempts + 1,
                last_error=r.reason,
                dead_at=now if r.dead else e.dead_at,
                dead_reason=r.reason if r.dead else e.dead_reason,
            )

    async def pending_count(self) -> int:
        return sum(1 for e in self._d.events if e.published_at is None and e.dead_at is None)

    async def backlog(self) -> OutboxBacklog:
        waiting = [e for e in self._d.events if e.published_at is None]
        pending = [e.staged_at for e in waiting if e.dead_at is None]
        return OutboxBacklog(
            pending=len(pending),
            oldest_staged_at=min((t for t in pending if t is not None), default=None),
            dead=len(waiting) - len(pending),
        )

    async def dead_letters(self, *, limit: int = 100) -> Sequence[EventRecord]:
        dead = [e for e in self._d.events if e.dead_at is not None and e.published_at is None]
        dead.sort(key=lambda e: (e.dead_at or e.staged_at, e.staged_seq))
        return tuple(dead[:limit])

    async def retry_dead_letter(self, event_id: str) -> bool:
        for i, e in enumerate(self._d.events):
            if e.event_id == event_id and e.dead_at is not None and e.published_at is None:
                self._d.events[i] = dataclasses.replace(
                    e, dead_at=None, dead_reason=None, attempts=0
                )
                return True
        return False


class MemoryChanges:
    """Change subscriptions over the in-memory event list; positions are ``(0, staged_seq)``
    because one process staging under one loop stages in commit order."""

    def __init__(self, data: MemoryData) -> None:
        self._d = data
        self._cursors = data.cursors

    async def subscribe(self, consumer: str, *, now: datetime, from_start: bool = True) -> bool:
        if consumer in self._cursors:
            return False
        self._cursors[consumer] = 0 if from_start else self._d.staged_seq
        return True

    async def read(self, consumer: str, *, limit: int = 500) -> ChangeBatch:
        if consumer not in self._cursors:
            raise UnknownConsumer(consumer)
        after = self._cursors[consumer]
        got = tuple(e for e in self._d.events if e.staged_seq > after)[:limit]
        position = (0, got[-1].staged_seq if got else after)
        return ChangeBatch(consumer=consumer, events=got, position=position)

    async def commit(self, consumer: str, position: tuple[int, int], *, now: datetime) -> None:
        if consumer not in self._cursors:
            raise UnknownConsumer(consumer)
        self._cursors[consumer] = max(self._cursors[consumer], position[1])

    async def unsubscribe(self, consumer: str) -> bool:
        return self._cursors.pop(consumer, None) is not None

    async def purge_published(self, *, before: datetime) -> OutboxPurge:
        read_to = min(self._cursors.values(), default=None)
        keep: list[EventRecord] = []
        deleted = held = 0
        for e in self._d.events:
            if e.published_at is not None and e.published_at < before:
                if read_to is None or e.staged_seq <= read_to:
                    deleted += 1
                    continue
                held += 1
            keep.append(e)
        self._d.events = keep
        return OutboxPurge(deleted=deleted, held_back=held)


class MemoryStores:
    """All four roles over one shared in-memory data set."""

    def __init__(self) -> None:
        self._data = MemoryData()
        self.journal = MemoryJournal(self._data)
        self.leases = MemoryLeaseStore(self._data)
        self.recovery = MemoryRecoveryIndex(self._data)
        self.catalog = MemoryCatalog(self._data)
        self.outbox = MemoryOutbox(self._data)
        self.changes = MemoryChanges(self._data)
        self.waits = MemoryWaits(self._data)
        self.stops = MemoryStops(self._data)
        self.retention = MemoryRetention(self._data)

    def commit_releases_lease(self) -> bool:
        """``CommitReleases``: the journal keeps the leases, so a terminal commit ends its
        run's lease in its own write."""
        return True

    async def create_leased(
        self, instance: NewInstance, *, owner: str, ttl: timedelta, now: datetime | None
    ) -> tuple[Lease | None, CreateResult | None]:
        """``LeasedCreate``: the lease and the instance in one step with no await between
        them, as PostgreSQL and SQLite make them one write, so tests of the engine start
        instances the way production does. As there, an existing instance is left as it is."""
        now = or_process_now(now)
        lease = self.leases.grant(instance.instance_id, owner=owner, ttl=ttl, now=now, floor=0)
        if lease is None:
            return None, None
        return lease, self.journal.create_now(instance, token=lease.token, now=now)

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def describe(self) -> str:
        return "memory (this process only; keeps nothing)"

    async def schema_version(self) -> int | None:
        return None
