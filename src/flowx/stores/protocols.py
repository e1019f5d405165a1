"""The store seam: small protocols, one per role (STYLE habit 7).

The engine and the host speak only these. A backend (memory, SQLite, PostgreSQL, Redis)
implements the roles it can serve and is held to ``flowx.testing.conformance``; a change to a
protocol extends that suite in the same commit.

Every time-dependent method takes ``now``: time is a parameter, so tests can move it. Where
leases and recovery are concerned (``acquire``, ``renew``, ``release``, ``open``, a commit's
``updated_at``, ``find_abandoned``) ``now=None`` means *the store's own clock*: that is what
production passes, so a node whose clock is off neither takes live work from its owner nor is
starved, and a dead node is recovered one TTL after its last write (R9.2).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from flowx.stores.records import (
    ArchivedInstance,
    ChangeBatch,
    CreateResult,
    EventRecord,
    ExpiredInstance,
    History,
    InstanceRecord,
    InstanceState,
    Lease,
    NewInstance,
    OutboxBacklog,
    OutboxPurge,
    RecoveryCandidate,
    RetentionPolicy,
    SignalReceipt,
    SignalRecord,
    StepCommit,
    StepRecord,
    StopReceipt,
    StopRequest,
    SuspendCommit,
)


@runtime_checkable
class FlowJournal(Protocol):
    """**Protocol:** the append-only journal of instances and their step boundaries."""

    async def create(
        self, instance: NewInstance, *, token: int, now: datetime | None
    ) -> CreateResult:
        """Insert the instance row with ``fence = token``.

        If the instance id, or ``(flow_id, idempotency_key)``, already exists, write nothing
        and return the existing row with ``created=False`` (R4.1). ``now=None`` stamps
        ``created_at``/``updated_at`` with the store's clock (R9.2): the recovery scan's idle
        filter reads ``updated_at``, so a node ahead of it that creates an instance and dies
        must not push its recovery back by its skew.
        """
        ...

    async def open(self, instance_id: str, *, token: int, now: datetime | None) -> History:
        """Take over an instance: raise its fence to ``token`` and read its history.

        One transaction: the fence rises before anything is read, so a zombie holding an older
        token is refused from this moment on (R2.4). Refuses with ``FencedOut`` if ``token`` is
        below the fence. Counts the takeover in ``resume_count`` (reset by every step commit),
        which is how a step that kills its process is told apart from a crash.
        A ``Pending`` (queued) or ``Suspended`` (woken or due) instance becomes ``Running``.
        Raises ``UnknownInstance`` if there is no such instance.
        """
        ...

    def commit(self, commit: StepCommit) -> Awaitable[int | None]:
        """Write one step boundary atomically, fenced (R2.3, R2.4). An ``async def`` does;
        a store may hand back its batch's future directly (one frame less on every step).

        Returns the ``sequence`` allocated to the step row (``None`` when there is no row).
        Raises ``FencedOut`` (nothing written), ``DuplicateStep`` (nothing written),
        ``UnknownInstance``, or ``JournalUnavailable`` (outcome unknown).
        """
        ...

    async def get(self, instance_id: str) -> InstanceRecord | None:
        """The instance row, or ``None``."""
        ...

    async def find_by_key(self, flow_id: str, idempotency_key: str) -> InstanceRecord | None:
        """The instance started with this idempotency key, or ``None``."""
        ...

    async def steps(self, instance_id: str) -> Sequence[StepRecord]:
        """Every committed step row of the instance, ordered by ``sequence``."""
        ...

    async def events(self, instance_id: str) -> Sequence[EventRecord]:
        """Every outbox row the instance staged, in staging order."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class InstanceQuery:
    """A page of the instance list: newest first, keyset-paged by ``(created_at, id)``."""

    limit: int = 50
    flow_id: str | None = None
    state: InstanceState | None = None
    before: tuple[datetime, str] | None = None
    flow_version: str | None = None
    tenant_id: str | None = None
    #: Only the sub-flow children of this instance.
    parent_id: str | None = None
    #: Only instances created at or after ``since`` and before ``until``.
    since: datetime | None = None
    until: datetime | None = None
    #: Only instances that have not ended.
    unfinished: bool = False
    #: Only instances started with this correlation id (not unique; flow_instance_correlation_idx).
    correlation_id: str | None = None


@runtime_checkable
class InstanceCatalog(Protocol):
    """**Protocol:** listing instances for operators (the CLI). Not on any hot path."""

    async def list_instances(self, query: InstanceQuery) -> Sequence[InstanceRecord]:
        """One page of instances, newest first."""
        ...

    async def count_instances(self, query: InstanceQuery, *, by: str) -> dict[str, int]:
        """How many instances match ``query`` (its filters; not its page), by ``state``, by
        ``flow`` (``flow_id``) or by ``version`` (``flow_id@flow_version``)."""
        ...


@runtime_checkable
class LeaseStore(Protocol):
    """**Protocol:** time-bounded exclusive ownership of one instance, with fencing tokens.

    Tokens are monotonic per instance and never restart: release and expiry update the lease
    row, they never delete it (R3.1).
    """

    async def acquire(
        self,
        instance_id: str,
        *,
        owner: str,
        ttl: timedelta,
        now: datetime | None,
        floor: int = 0,
    ) -> Lease | None:
        """Grant the lease if it is free or expired, with a token above every token issued
        for this instance before *and* above ``floor``; ``None`` if another owner holds it.

        ``floor`` is the journal's fence when the host knows it: a store that lost its
        counters (Redis with no persistence) must still never issue a token at or below it.
        A lease can be acquired before its instance exists.
        """
        ...

    async def renew(self, lease: Lease, *, ttl: timedelta, now: datetime | None) -> Lease:
        """Extend a live lease; raise ``LeaseLost`` if its token is no longer current or it
        has expired."""
        ...

    async def renew_many(
        self, leases: Sequence[Lease], *, ttl: timedelta, now: datetime | None
    ) -> Sequence[Lease | None]:
        """Extend every live lease in one round trip; ``None`` in the place of each one whose
        token is no longer current or that has expired. A node renews all its leases with
        this, once per interval, so renewals cost one write however many it holds (R9.1)."""
        ...

    async def release(self, lease: Lease, *, now: datetime | None) -> None:
        """End the lease now if ``lease.token`` is still current. Idempotent; never deletes."""
        ...

    async def current(self, instance_id: str) -> Lease | None:
        """The last lease issued for the instance, live or not (for operators and tests)."""
        ...


@runtime_checkable
class RecoveryIndex(Protocol):
    """**Protocol:** the scan that finds instances a dead node left behind (R3.4).

    A class of its own rather than a journal method: a scan is not part of executing an
    instance, and the type every durable write passes through need not carry it.
    """

    async def find_abandoned(
        self, *, now: datetime | None, idle_for: timedelta, limit: int, offset: int = 0
    ) -> Sequence[RecoveryCandidate]:
        """One bounded page of instances nothing has written to since ``now - idle_for``,
        oldest first, skipping ``offset`` rows: ``Pending``, ``Running`` or ``Compensating``.

        No instance appears twice in a page. Whether one is really abandoned is settled by
        acquiring its lease. Served by an index in ``updated_at`` order (no sort).
        """
        ...

    async def find_queued(self, *, limit: int, offset: int = 0) -> Sequence[RecoveryCandidate]:
        """One bounded page of ``Pending`` instances — started for any worker to run, and not
        yet taken — oldest first. A separate query from the idle scan, because a queued
        instance needs no TTL to pass before a worker may take it."""
        ...


@runtime_checkable
class WaitStore(Protocol):
    """**Protocol:** instances that wait — for a signal, a timer or a child (R2.10, R2.11).

    A Suspended instance is a row and nothing else: no lease, no task, no memory in any worker
    (R6.3). It is woken by ``signal`` (or its child's end), which makes it ``Pending`` for any
    worker, or by the timer service, which finds it with ``find_due`` and takes its lease.
    """

    async def suspend(self, commit: SuspendCommit) -> bool:
        """Seal the instance ``Suspended`` at ``commit.wake``, fenced — or ``Pending`` if an
        operator has asked it to stop (R9.4), so that a request that reached the run too
        late to stop it before the seal still finds it runnable, not asleep; ``False`` (nothing
        written) if a signal it waits for is already in the inbox or its child has already
        ended, so the caller carries on instead. Raises ``FencedOut`` / ``UnknownInstance``."""
        ...

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
        """Keep a signal in the instance's inbox; if the instance is Suspended waiting for
        ``name``, make it ``Pending`` in the same write.

        Decided in this order, all under one lock on the instance (R2.10): a ``key`` already
        received writes nothing and says ``duplicate`` (with the first copy's seq), even once
        the instance has ended, so a sender that retries gets its success; otherwise an
        instance in a terminal state raises ``InstanceFinished`` (nothing is kept: no run would
        ever read it); otherwise, with ``limit`` (the most signals of ``name`` the instance
        can ever take: its waits for ``name`` that happen once and have not timed out), an
        inbox that already holds ``limit`` signals of ``name`` writes nothing and says
        ``duplicate`` (with the latest one's seq). Check and insert are one decision, so
        signals racing to a wait that happens once leave exactly one kept. ``limit=None``:
        no limit (a wait inside a ``for_each`` takes one per element). Raises
        ``UnknownInstance``."""
        ...

    async def signals(self, instance_id: str, name: str) -> Sequence[SignalRecord]:
        """The inbox for one signal name, in order of arrival."""
        ...

    async def find_due(
        self, *, now: datetime, limit: int, flows: Sequence[str] | None = None
    ) -> Sequence[RecoveryCandidate]:
        """Suspended instances whose ``wake_at`` is at or before ``now``, earliest first;
        served by ``flow_instance_wake_idx`` (a partial index over Suspended rows).

        ``flows`` (``"flow_id@version"`` refs) keeps only instances of those flows: a node
        asks for what it can run, so due rows of a version no node here carries (R7.3) can
        never fill its page and starve the rest."""
        ...

    async def next_wake(self, *, flows: Sequence[str] | None = None) -> datetime | None:
        """The earliest ``wake_at`` of any Suspended instance (same index); with ``flows``,
        of those flows only, as ``find_due``."""
        ...

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
        """Re-open a finished instance for a replay, fenced: state ``Pending``,
        ``replay_sequence = next_sequence`` (earlier failures stop counting against retry
        budgets), ``resume_from_step = from_step``, ``error`` kept. Writes no step row: the
        history is never rewritten; what re-runs is journaled as new attempts.

        ``replay_from = rerun_from``: a replay re-running forward from that step (``None``
        for any other replay); it also clears ``stop_request`` (a cancelled instance replayed
        is no longer being stopped) and the wait it was sealed at (``wake_*``: a re-run wait
        or sleep starts afresh). ``deadline``, when given, replaces ``deadline_at`` (a
        timed-out instance needs a new one). ``resume`` (a quarantined instance put back)
        keeps ``replay_sequence`` and ``replay_from`` as they were: nothing re-runs, so the
        rows count as they did. Every rearm zeroes ``resume_count``: an operator stepped in."""
        ...


@runtime_checkable
class StopStore(Protocol):
    """**Protocol:** an operator's cancel and terminate (R9.4), kept where the node running
    the instance will read it."""

    async def request_stop(self, instance_id: str, request: StopRequest) -> StopReceipt:
        """Keep ``request`` on the instance and on every unfinished descendant (sub-flow
        children, theirs, …), in one write under their row locks: ``stop_request`` set, a row
        in each inbox (name ``STOP_SIGNAL``, key the mode, so a repeat writes nothing), and a
        Suspended one made ``Pending`` so a node takes it at once. A request is written only
        where it outranks the one kept (nothing, or a cancel under a terminate).

        An instance that ended by a stop answers ``status="ended"`` (a repeated command is
        inert); one that ended otherwise raises ``InstanceFinished``; no row raises
        ``UnknownInstance``. The stop itself is carried out by a node: fenced, like any write.
        """
        ...

    async def stop_requests(self, instance_ids: Sequence[str]) -> dict[str, str]:
        """The ``stop_request`` text of each of these instances that has one: what a node
        asks, once per lease renewal, about the instances it runs."""
        ...


@runtime_checkable
class RetentionStore(Protocol):
    """**Protocol:** what the retention sweep reads and deletes (R2.13). A sweep finds a
    page of expired instances, hands their contents to the archiver, and deletes exactly
    what it archived; the outbox's published events go by ``ChangeFeed.purge_published``."""

    async def policies(self) -> Sequence[RetentionPolicy]:
        """Every ``retention_policy`` row, ``'*'`` (the defaults) included."""
        ...

    async def set_policy(self, policy: RetentionPolicy) -> None:
        """Insert or replace the policy of ``(flow_id, state_class)``."""
        ...

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
        """Up to ``limit`` instances in ``states`` last written before ``ended_before`` — of
        ``flow_id``, or of any flow but ``skip_flows`` when ``flow_id`` is ``None`` — oldest
        first, keyset-paged after ``(updated_at, instance_id)``, each with why it is held
        back if it is. Served by ``flow_instance_ended_idx``."""
        ...

    async def contents(self, instance_ids: Sequence[str]) -> Sequence[ArchivedInstance]:
        """Everything the journal holds of each of these instances (those that exist)."""
        ...

    async def delete(self, expired: Sequence[ExpiredInstance]) -> int:
        """Delete each instance (its steps, signals, events and lease with it) that is still
        ended and still at the ``updated_at`` it was found at, and is still not held back;
        how many were deleted. One write: two sweeps deleting one page delete each row once.
        """
        ...


@runtime_checkable
class StoreClock(Protocol):
    """**Protocol:** a store that keeps time of its own (a server), so a node can measure its
    offset to it. A node too far off refuses to start (R9.2); stores in this process
    (memory, SQLite) share the node's clock and do not implement it."""

    async def store_clock(self) -> list[tuple[str, datetime]]:
        """Each clock this store decides lease or recovery time with, as ``(what, now)``."""
        ...


@runtime_checkable
class RoundTripBound(Protocol):
    """**Protocol:** a store reached over a network, whose round trips a host bounds to a
    fraction of its lease TTL before opening it (R9.1)."""

    def bound_round_trips(self, seconds: float) -> None:
        """No round trip (or block of them) waits for an answer longer than ``seconds``."""
        ...


@runtime_checkable
class LeasedCreate(Protocol):
    """**Protocol (optional):** a backend that keeps journal and leases in one database can
    take a new instance's lease and create the instance in one write — one round trip (one
    fsync) fewer on every start. Declared by the capability, never guessed from the backend.
    """

    async def create_leased(
        self, instance: NewInstance, *, owner: str, ttl: timedelta, now: datetime | None
    ) -> tuple[Lease | None, CreateResult | None]:
        """``(None, None)`` if another owner holds the instance's lease (nothing written).
        Otherwise the granted lease and the outcome of ``FlowJournal.create`` under its token;
        when that says ``created=False`` the caller releases the lease it was given."""
        ...


class OutboxClaim(Protocol):
    """**Protocol:** a batch of pending events held by one publisher until the claim ends.

    ``events`` are in ``staged_seq`` order, and for each partition key they are its oldest
    pending events: none of them has an older pending sibling outside this claim (R5.3).
    What the publisher reports is written when the claim ends, in the claim's own
    transaction where the backend has one (R5.2); a claim left by an exception writes nothing
    and its events stay pending.
    """

    @property
    def events(self) -> Sequence[EventRecord]: ...

    def published(self, count: int) -> None:
        """The broker acknowledged ``events[:count]``: mark them published."""
        ...

    def refused(self, event_id: str, *, reason: str, dead: bool) -> None:
        """The broker refused this event: count the attempt and keep the reason; with
        ``dead`` move it aside as a dead letter, so it no longer holds its key (R5.5)."""
        ...


class OutboxStore(Protocol):
    """**Protocol:** the publisher's side of the transactional outbox (SPEC §5)."""

    def claim(
        self, *, limit: int, now: datetime, owner: str, dead_letters_hold_keys: bool = False
    ) -> AbstractAsyncContextManager[OutboxClaim]:
        """Claim up to ``limit`` pending events (fewer when keys are held by older siblings
        another publisher has claimed). ``owner`` names the publisher in the store. With
        ``dead_letters_hold_keys`` a dead letter holds its key like a pending event until it
        is resent (R5.5's "unless configured to")."""
        ...

    async def pending_count(self) -> int:
        """How many events wait to be published (dead letters excluded)."""
        ...

    async def backlog(self) -> OutboxBacklog:
        """Pending events, the staging time of the oldest of them, and dead letters, in one
        read (the ``flowx_outbox_*`` gauges)."""
        ...

    async def dead_letters(self, *, limit: int = 100) -> Sequence[EventRecord]:
        """Dead letters, oldest first."""
        ...

    async def retry_dead_letter(self, event_id: str) -> bool:
        """Put a dead letter back in the queue with its attempts reset; ``False`` if there is
        no dead letter with this id. It keeps its ``staged_seq``: newer events of its key may
        already have gone out, so a resent dead letter arrives after them."""
        ...


class ChangeFeed(Protocol):
    """**Protocol:** change subscriptions — a named consumer reads staged events through its
    own ``change_cursor`` row, in order, at-least-once, with no broker (R2.14). A declared
    consumer holds back the outbox purge until it has read what would be purged (R2.13)."""

    async def subscribe(self, consumer: str, *, now: datetime, from_start: bool = True) -> bool:
        """Declare ``consumer``; ``False`` if it already was (its cursor is kept). A new one
        starts at the oldest event retained, or with ``from_start=False`` at what is staged
        from now on."""
        ...

    async def read(self, consumer: str, *, limit: int = 500) -> ChangeBatch:
        """Up to ``limit`` events after the consumer's cursor, in order. An event that has
        committed may first show in a later read, never be skipped: on PostgreSQL nothing is
        read past a transaction that can still stage events in the store's schema. Raises
        ``UnknownConsumer`` for a consumer never subscribed."""
        ...

    async def commit(self, consumer: str, position: tuple[int, int], *, now: datetime) -> None:
        """Move the cursor to ``position`` (from a ``ChangeBatch``); never backwards."""
        ...

    async def unsubscribe(self, consumer: str) -> bool:
        """Forget the consumer, so it no longer holds back the purge."""
        ...

    async def purge_published(self, *, before: datetime) -> OutboxPurge:
        """Delete events published before ``before`` that every subscription has read."""
        ...


@runtime_checkable
class StagedWakeups(Protocol):
    """**Protocol (optional):** an outbox that can tell a publisher that another process
    staged events (PostgreSQL's LISTEN/NOTIFY), so an idle publisher need not poll hot."""

    async def wait_staged(self, timeout: float) -> bool:
        """``True`` when told of staged events within ``timeout`` seconds."""
        ...


@runtime_checkable
class QueueClaims(Protocol):
    """**Protocol (optional):** stores that claim queued work in one write: a page of
    ``Pending`` instances, each leased (the fence raised to the new token), made ``Running``
    and read, so that workers draining one backlog never take the same rows. Stores whose
    leases live elsewhere do not declare it; the recovery scan then takes each row itself."""

    async def claim_queued(
        self,
        *,
        owner: str,
        ttl: timedelta,
        limit: int,
        flows: Sequence[str] | None,
        now: datetime | None,
    ) -> Sequence[tuple[Lease, History]]:
        """Up to ``limit`` of the oldest ``Pending`` instances of ``flows`` (``flow@version``
        refs; ``None``: any), each with the lease granted to ``owner`` and its history read
        under it. An instance whose lease is live elsewhere is left ``Pending``."""
        ...


@runtime_checkable
class CommitReleases(Protocol):
    """**Protocol (optional):** stores whose journal keeps the leases too, so a terminal
    commit can end its run's lease in the same write (``StepCommit.release_lease``): one
    write a flow fewer (SQLite, memory). A journal paired with another lease store does not
    declare it; nor does PostgreSQL, where the lease row would stay locked for the commit's
    WAL flush and renewals would queue behind slow commits (R9.1): it batches releases on
    its renewals' connection instead."""

    def commit_releases_lease(self) -> bool:
        """``True``: ``journal.commit`` honours ``release_lease``."""
        ...


@runtime_checkable
class WorkWakeups(Protocol):
    """**Protocol (optional):** stores that can tell an idle worker that another process made
    an instance runnable — a queued start, a signal or a child's end that made an instance
    ``Pending``, a run handed back (PostgreSQL: LISTEN/NOTIFY; SQLite: the file's
    ``data_version``). Only latency rests on it: the sweeps remain the safety net."""

    async def wait_work(self, timeout: float) -> bool:
        """``True`` when told of new work within ``timeout`` seconds (it may be a false
        alarm: the caller looks, and finds nothing); ``False`` after ``timeout``."""
        ...


@runtime_checkable
class Stores(Protocol):
    """**Protocol:** what a backend hands the host: its roles, plus lifecycle."""

    @property
    def journal(self) -> FlowJournal: ...

    @property
    def leases(self) -> LeaseStore: ...

    @property
    def recovery(self) -> RecoveryIndex: ...

    @property
    def catalog(self) -> InstanceCatalog: ...

    @property
    def outbox(self) -> OutboxStore: ...

    @property
    def changes(self) -> ChangeFeed: ...

    @property
    def waits(self) -> WaitStore: ...

    @property
    def stops(self) -> StopStore: ...

    @property
    def retention(self) -> RetentionStore: ...

    async def open(self) -> None:
        """Connect and bring the schema up to date (or refuse one the code does not know)."""
        ...

    async def close(self) -> None:
        """Release connections and threads."""
        ...

    def describe(self) -> str:
        """A one-line description for logs and the CLI (no secrets)."""
        ...

    async def schema_version(self) -> int | None:
        """The migration the store's schema is at; ``None`` for a store with no schema."""
        ...
