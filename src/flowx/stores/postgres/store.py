"""The PostgreSQL journal, lease store, recovery index and catalog.

Every query is a constant below, with the index that serves it named beside it. The step
commit, the hot path, lives in ``commit.py``.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, LiteralString

from psycopg.rows import dict_row

from flowx.redaction import redact
from flowx.stores.columns import (
    ACTIVE_STATES_SQL,
    CANDIDATE_COLUMNS,
    CREATE_COLUMNS,
    EVENT_COLUMNS,
    INSTANCE_COLUMNS,
    STEP_COLUMNS,
    TERMINAL_STATES_SQL,
    event_of,
    instance_of,
    step_of,
)
from flowx.stores.errors import FencedOut, UnknownInstance
from flowx.stores.postgres.changes import PostgresChanges
from flowx.stores.postgres.claims import claim_queued
from flowx.stores.postgres.commit import GroupCommitter, commit_one
from flowx.stores.postgres.creates import GroupCreator
from flowx.stores.postgres.database import PostgresDatabase
from flowx.stores.postgres.leases import GRANT_OVER_EXPIRED, PostgresLeaseStore
from flowx.stores.postgres.notify import WORK, Listener, Notifier
from flowx.stores.postgres.outbox import PostgresOutbox
from flowx.stores.postgres.reads import SELECT_INSTANCE, BatchedReads
from flowx.stores.postgres.retention import PostgresRetention
from flowx.stores.postgres.roles import check_grants, check_prefix, create_roles, grant_logins
from flowx.stores.postgres.rows import candidates
from flowx.stores.postgres.schema import MIGRATION_LOCK
from flowx.stores.postgres.stops import PostgresStops
from flowx.stores.postgres.waits import PostgresWaits
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import (
    CHILD_WAIT,
    CreateResult,
    EventRecord,
    History,
    InstanceRecord,
    InstanceState,
    Lease,
    NewInstance,
    RecoveryCandidate,
    StepCommit,
    StepRecord,
)

#: Read once: on CPython 3.11 each read of an enum class's member passes through its
#: metaclass's ``__getattr__`` hook (a few times a dict lookup), and this is the step commit's path.
_PENDING = InstanceState.PENDING

# flow_instance_idempotency_idx.
SELECT_BY_KEY: Final[LiteralString] = (
    "SELECT " + INSTANCE_COLUMNS + " FROM flow_instance WHERE flow_id = %s AND idempotency_key = %s"
)
# The resume read: flow_step_sequence_key, rows in commit order (R2.8). Concurrent commits
# interleave instances' rows on disk, and the planner then prefers a bitmap scan plus a sort;
# RESUME_READ_PLAN, run first in the same transaction, keeps it on the ordered index scan
# (measured: 0.04 ms against 0.16 ms for 100 rows).
SELECT_STEPS: Final[LiteralString] = (
    "SELECT " + STEP_COLUMNS + " FROM flow_step WHERE instance_id = %s ORDER BY sequence"
)
RESUME_READ_PLAN: Final[LiteralString] = "SET LOCAL enable_sort = off"
# outbox_event_instance_idx.
# Every column an EventRecord carries (its attempts, dead letter and trace too, for show).
SELECT_EVENTS: Final[LiteralString] = (
    "SELECT " + EVENT_COLUMNS + " FROM outbox_event o WHERE o.instance_id = %s "
    "ORDER BY o.sequence, o.ordinal"
)

INSERT_INSTANCE: Final[LiteralString] = (
    "INSERT INTO flow_instance (" + CREATE_COLUMNS + ") "
    "VALUES (%(instance_id)s, %(flow_id)s, %(flow_version)s, %(tenant_id)s, %(state)s, "
    "%(token)s, %(input)s::json, %(state_bag)s::json, %(idempotency_key)s, "
    "%(correlation_id)s, %(deadline_at)s, %(parent_instance_id)s, %(parent_scope)s, "
    "%(parent_step_id)s, %(codec_version)s, coalesce(%(now)s::timestamptz, now()), "
    "coalesce(%(now)s::timestamptz, now()), %(trace_context)s) "
    "ON CONFLICT DO NOTHING RETURNING " + INSTANCE_COLUMNS
)

# Take over: the fence rises before anything is read (R2.4). A queued (Pending) or woken
# (Suspended) instance is Running from here on. Primary key.
OPEN_INSTANCE: Final[LiteralString] = (
    "UPDATE flow_instance SET fence = %(token)s, resume_count = resume_count + 1, "
    "state = CASE WHEN state IN ('Pending', 'Suspended') THEN 'Running' ELSE state END, "
    "updated_at = coalesce(%(now)s::timestamptz, now()), version = version + 1 "
    "WHERE instance_id = %(instance_id)s AND fence <= %(token)s RETURNING " + INSTANCE_COLUMNS
)
FENCE_OF: Final[LiteralString] = "SELECT fence FROM flow_instance WHERE instance_id = %s"

# A child's terminal commit wakes its parent (StepCommit.notify_parent), in the commit's own
# transaction and after it, under the child's row lock. Lock order is child, then parent; the
# parent's suspend locks only the parent and merely reads the child, so the two cannot
# deadlock. Each statement takes a fresh snapshot (READ COMMITTED): once the parent's row lock
# is held, a suspend that sealed it has committed and the conditional update sees it, and a
# suspend still to come sees this child's end and does not seal. All primary key.
PARENT_OF: Final[LiteralString] = (
    "SELECT parent_instance_id, parent_step_id, parent_scope FROM flow_instance "
    "WHERE instance_id = %s"
)
LOCK_PARENT: Final[LiteralString] = "SELECT 1 FROM flow_instance WHERE instance_id = %s FOR UPDATE"
WAKE_PARENT: Final[LiteralString] = (
    "UPDATE flow_instance SET state = 'Pending', "
    "updated_at = coalesce(%(now)s::timestamptz, now()), version = version + 1 "
    "WHERE instance_id = %(parent)s AND state = 'Suspended' AND wake_signal = %(wait)s "
    "AND wake_step_id = %(step_id)s AND wake_scope = %(scope)s"
)

# A new instance's lease and its row in one statement (LeasedCreate). The instance takes the
# granted token as its fence; an existing instance (same id or key) is left untouched.
CREATE_LEASED: Final[LiteralString] = (
    """
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), granted AS (
    INSERT INTO flow_lease AS l (instance_id, owner_node, fencing_token, expires_at, acquired_at)
    SELECT %(instance_id)s, %(owner)s, 1, t.now + %(ttl)s::interval, t.now FROM t
"""
    + GRANT_OVER_EXPIRED
    + """    RETURNING fencing_token, expires_at, acquired_at
), created AS (
    INSERT INTO flow_instance ("""
    + CREATE_COLUMNS
    + """)
    SELECT %(instance_id)s, %(flow_id)s, %(flow_version)s, %(tenant_id)s, %(state)s,
           g.fencing_token, %(input)s::json, %(state_bag)s::json, %(idempotency_key)s,
           %(correlation_id)s, %(deadline_at)s::timestamptz, %(parent_instance_id)s::uuid,
           %(parent_scope)s, %(parent_step_id)s::int, %(codec_version)s, g.acquired_at,
           g.acquired_at, %(trace_context)s::text
      FROM granted g
    ON CONFLICT DO NOTHING
    RETURNING """
    + INSTANCE_COLUMNS
    + """
)
SELECT g.fencing_token AS lease_token, g.expires_at AS lease_expires,
       g.acquired_at AS lease_acquired, c.*
  FROM granted g LEFT JOIN created c ON true
"""
)
# flow_instance_abandoned_idx: a range scan in (updated_at, instance_id) order, no sort.
# The cutoff is the server's clock less the idle time unless the caller pins it (R9.2).
FIND_ABANDONED: Final[LiteralString] = (
    "SELECT " + CANDIDATE_COLUMNS + " FROM flow_instance "
    "WHERE state IN " + ACTIVE_STATES_SQL + " "
    "AND updated_at < coalesce(%s::timestamptz, now()) - %s::interval "
    "ORDER BY updated_at, instance_id LIMIT %s OFFSET %s"
)
# flow_instance_queued_idx.
FIND_QUEUED: Final[LiteralString] = (
    "SELECT " + CANDIDATE_COLUMNS + " FROM flow_instance "
    "WHERE state = 'Pending' ORDER BY updated_at, instance_id LIMIT %s OFFSET %s"
)
# flow_instance_created_idx, read backwards.
# Every filter of InstanceQuery; an unset one is NULL and drops out. Not a hot path: an
# operator's list, served newest first by flow_instance_created_idx.
_FILTERS: Final[LiteralString] = (
    "(%(flow_id)s::text IS NULL OR flow_id = %(flow_id)s) "
    "AND (%(state)s::text IS NULL OR state = %(state)s) "
    "AND (%(flow_version)s::text IS NULL OR flow_version = %(flow_version)s) "
    "AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s) "
    "AND (%(parent_id)s::uuid IS NULL OR parent_instance_id = %(parent_id)s::uuid) "
    "AND (%(correlation_id)s::text IS NULL OR correlation_id = %(correlation_id)s) "
    "AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s) "
    "AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s) "
    "AND (NOT %(unfinished)s OR state NOT IN " + TERMINAL_STATES_SQL + ") "
)
LIST_INSTANCES: Final[LiteralString] = (
    "SELECT " + INSTANCE_COLUMNS + " FROM flow_instance WHERE " + _FILTERS + "AND "
    "(%(before_at)s::timestamptz IS NULL OR (created_at, instance_id) < "
    "(%(before_at)s, %(before_id)s::uuid)) "
    "ORDER BY created_at DESC, instance_id DESC LIMIT %(limit)s"
)
COUNT_BY_STATE: Final[LiteralString] = (
    "SELECT state, count(*) FROM flow_instance WHERE " + _FILTERS + "GROUP BY 1 ORDER BY 1"
)
COUNT_BY_FLOW: Final[LiteralString] = (
    "SELECT flow_id, count(*) FROM flow_instance WHERE " + _FILTERS + "GROUP BY 1 ORDER BY 1"
)
COUNT_BY_VERSION: Final[LiteralString] = (
    "SELECT flow_id || '@' || flow_version, count(*) FROM flow_instance WHERE "
    + _FILTERS
    + "GROUP BY 1 ORDER BY 1"
)


def _filter_params(query: InstanceQuery) -> dict[str, Any]:
    return {
        "flow_id": query.flow_id,
        "state": query.state.value if query.state else None,
        "flow_version": query.flow_version,
        "tenant_id": query.tenant_id,
        "parent_id": query.parent_id,
        "correlation_id": query.correlation_id,
        "since": query.since,
        "until": query.until,
        "unfinished": query.unfinished,
    }


def create_params(instance: NewInstance, token: int, now: datetime | None) -> dict[str, Any]:
    return {
        "instance_id": instance.instance_id,
        "flow_id": instance.flow_id,
        "flow_version": instance.flow_version,
        "tenant_id": instance.tenant_id,
        "state": instance.state.value,
        "token": token,
        "input": instance.input,
        "state_bag": instance.state_bag,
        "idempotency_key": instance.idempotency_key,
        "correlation_id": instance.correlation_id,
        "deadline_at": instance.deadline_at,
        "parent_instance_id": instance.parent_instance_id,
        "parent_scope": instance.parent_scope,
        "parent_step_id": instance.parent_step_id,
        "codec_version": instance.codec_version,
        "trace_context": instance.trace_context,
        "now": now,
    }


async def existing(cur: Any, instance: NewInstance) -> InstanceRecord:
    """The row a create conflicted with: same id, or same flow and idempotency key."""
    row = await (await cur.execute(SELECT_INSTANCE, (instance.instance_id,))).fetchone()
    if row is None and instance.idempotency_key is not None:
        row = await (
            await cur.execute(SELECT_BY_KEY, (instance.flow_id, instance.idempotency_key))
        ).fetchone()
    if row is None:  # conflicted, then vanished: a concurrent purge; report it
        raise UnknownInstance(instance.instance_id)
    return instance_of(row)


class PostgresJournal:
    """``FlowJournal`` on PostgreSQL."""

    def __init__(
        self,
        db: PostgresDatabase,
        notifier: Notifier | None = None,
        work: Notifier | None = None,
    ) -> None:
        self._db = db
        self._group = GroupCommitter(db)
        self._reads = BatchedReads(db)
        self._creates = GroupCreator(db, self.create_one, existing)
        self._notifier = notifier
        self._work = work

    async def create(
        self, instance: NewInstance, *, token: int, now: datetime | None
    ) -> CreateResult:
        params = create_params(instance, token, now)
        async with self._db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            row = await (await cur.execute(INSERT_INSTANCE, params)).fetchone()
            if row is not None:
                if instance.state is InstanceState.PENDING and self._work is not None:
                    self._work.mark()  # a queued start: any worker may take it now
                return CreateResult(instance=instance_of(row), created=True)
            return CreateResult(instance=await existing(cur, instance), created=False)

    async def warm(self) -> None:
        """Open the committers' own connections (at store open)."""
        await self._group.warm()

    async def close(self) -> None:
        """Close the committers' own connections."""
        await self._group.close()

    async def create_leased(
        self, instance: NewInstance, *, owner: str, ttl: timedelta, now: datetime | None
    ) -> tuple[Lease | None, CreateResult | None]:
        # Concurrent starts share statements (creates.py), as commits do.
        return await self._creates.create(instance, owner=owner, ttl=ttl, now=now)

    async def create_one(
        self, instance: NewInstance, *, owner: str, ttl: timedelta, now: datetime | None
    ) -> tuple[Lease | None, CreateResult | None]:
        """One start's lease and row in a statement of its own."""
        params = {**create_params(instance, 0, now), "owner": owner, "ttl": ttl}
        async with self._db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            row = await (await cur.execute(CREATE_LEASED, params, prepare=True)).fetchone()
            if row is None:
                return None, None
            lease = Lease(
                instance_id=instance.instance_id,
                owner=owner,
                token=int(row.pop("lease_token")),
                expires_at=row.pop("lease_expires"),
            )
            row.pop("lease_acquired")
            if row["instance_id"] is not None:
                return lease, CreateResult(instance=instance_of(row), created=True)
            return lease, CreateResult(instance=await existing(cur, instance), created=False)

    async def open(self, instance_id: str, *, token: int, now: datetime | None) -> History:
        # One round trip: the fence rises, then the history is read, in one transaction sent
        # as a pipeline. A refused open reads the history for nothing, and says why below.
        params = {"instance_id": instance_id, "token": token, "now": now}
        async with self._db.connection() as conn:
            opened = conn.cursor(row_factory=dict_row)
            read = conn.cursor(row_factory=dict_row)
            async with conn.pipeline(), conn.transaction():
                await opened.execute(OPEN_INSTANCE, params, prepare=True)
                await conn.execute(RESUME_READ_PLAN)
                await read.execute(SELECT_STEPS, (instance_id,), prepare=True)
            row = await opened.fetchone()
            if row is None:
                fence = await (await conn.execute(FENCE_OF, (instance_id,))).fetchone()
                if fence is None:
                    raise UnknownInstance(instance_id)
                raise FencedOut(instance_id, token, int(fence[0]))
            steps = await read.fetchall()
            return History(instance=instance_of(row), steps=tuple(step_of(s) for s in steps))

    def commit(self, commit: StepCommit) -> Awaitable[int | None]:
        """Queued for the group committer at once, in the order commits are asked for
        (concurrent commits from many instances share statements, commit.py). A commit that
        tells no one (a step's, nearly always) is answered by the committer's own future: no
        coroutine of this one around it on every step."""
        if commit.notify_parent:
            # A child's end: rare, and it writes two rows, so it keeps the group committer's
            # statements out of it and takes a transaction of its own.
            return self._commit_child_end(commit)
        queued = self._group.commit(commit)
        if (commit.events and self._notifier is not None) or (
            self._work is not None and commit.state is _PENDING
        ):
            # Registered before anyone awaits it: told before the caller runs on, and told
            # even if the caller stops waiting (the commit lands all the same).
            queued.add_done_callback(functools.partial(self._tell, commit))
        return queued

    def _tell(self, commit: StepCommit, done: asyncio.Future[int | None]) -> None:
        if not done.cancelled() and done.exception() is None:
            self._landed(commit)

    def _landed(self, commit: StepCommit) -> None:
        """Once a commit landed: publishers told it staged events, idle workers that an
        instance became runnable (a run handed back ``Pending``; a child's end may have made
        its parent Pending)."""
        if commit.events and self._notifier is not None:
            self._notifier.mark()
        if self._work is not None and (
            commit.notify_parent or commit.state is InstanceState.PENDING
        ):
            self._work.mark()

    async def _commit_child_end(self, commit: StepCommit) -> int | None:
        sequence = await self._commit_and_wake_parent(commit)
        self._landed(commit)
        return sequence

    async def _commit_and_wake_parent(self, commit: StepCommit) -> int | None:
        async with self._db.connection() as conn, conn.transaction():
            sequence = await commit_one(conn, commit)  # locks this instance's row
            row = await (await conn.execute(PARENT_OF, (commit.instance_id,))).fetchone()
            if row is not None and row[0] is not None:
                parent, step_id, scope = row
                await conn.execute(LOCK_PARENT, (parent,))
                await conn.execute(
                    WAKE_PARENT,
                    {
                        "now": commit.now,
                        "parent": parent,
                        "wait": CHILD_WAIT,
                        "step_id": step_id,
                        "scope": scope,
                    },
                )
            return sequence

    async def get(self, instance_id: str) -> InstanceRecord | None:
        return await self._reads.instance(instance_id)

    async def find_by_key(self, flow_id: str, idempotency_key: str) -> InstanceRecord | None:
        async with self._db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            row = await (await cur.execute(SELECT_BY_KEY, (flow_id, idempotency_key))).fetchone()
            return instance_of(row) if row else None

    async def steps(self, instance_id: str) -> Sequence[StepRecord]:
        async with self._db.connection() as conn, conn.transaction():
            await conn.execute(RESUME_READ_PLAN)
            cur = conn.cursor(row_factory=dict_row)
            rows = await (await cur.execute(SELECT_STEPS, (instance_id,))).fetchall()
            return tuple(step_of(r) for r in rows)

    async def events(self, instance_id: str) -> Sequence[EventRecord]:
        async with self._db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            rows = await (await cur.execute(SELECT_EVENTS, (instance_id,))).fetchall()
            return tuple(event_of(r) for r in rows)


class PostgresRecoveryIndex:
    """``RecoveryIndex``: two index-ordered queries, bounded, no sort (R3.4)."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    async def find_abandoned(
        self, *, now: datetime | None, idle_for: timedelta, limit: int, offset: int = 0
    ) -> Sequence[RecoveryCandidate]:
        return await self._page(FIND_ABANDONED, (now, idle_for, limit, offset))

    async def find_queued(self, *, limit: int, offset: int = 0) -> Sequence[RecoveryCandidate]:
        return await self._page(FIND_QUEUED, (limit, offset))

    async def _page(
        self, query: LiteralString, args: tuple[Any, ...]
    ) -> Sequence[RecoveryCandidate]:
        return await candidates(self._db, query, args)


class PostgresCatalog:
    """``InstanceCatalog``: newest first, keyset paged."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    async def list_instances(self, query: InstanceQuery) -> Sequence[InstanceRecord]:
        if query.parent_id is not None and not _is_uuid(query.parent_id):
            return ()
        params = {
            **_filter_params(query),
            "before_at": query.before[0] if query.before else None,
            "before_id": query.before[1] if query.before else None,
            "limit": query.limit,
        }
        async with self._db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            rows = await (await cur.execute(LIST_INSTANCES, params)).fetchall()
        return tuple(instance_of(r) for r in rows)

    async def count_instances(self, query: InstanceQuery, *, by: str) -> dict[str, int]:
        if query.parent_id is not None and not _is_uuid(query.parent_id):
            return {}
        statement = {"state": COUNT_BY_STATE, "flow": COUNT_BY_FLOW}.get(by, COUNT_BY_VERSION)
        async with self._db.connection() as conn:
            rows = await (await conn.execute(statement, _filter_params(query))).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


class PostgresStores:
    """All the roles over one PostgreSQL database and schema (R1.2)."""

    def __init__(
        self, dsn: str, *, schema: str = "flowx", migrate: bool = True, **pool: Any
    ) -> None:
        self.db = PostgresDatabase(dsn, schema=schema, **pool)
        self._migrate = migrate
        self.notifier = Notifier(self.db)
        self.work_notifier = Notifier(self.db, WORK)
        self._work_listener = Listener(self.db, WORK)
        self.journal = PostgresJournal(self.db, self.notifier, self.work_notifier)
        self.leases = PostgresLeaseStore(self.db, self.work_notifier)
        self.recovery = PostgresRecoveryIndex(self.db)
        self.catalog = PostgresCatalog(self.db)
        self.outbox = PostgresOutbox(self.db)
        self.changes = PostgresChanges(self.db)
        self.waits = PostgresWaits(self.db, self.work_notifier)
        self.stops = PostgresStops(self.db, self.work_notifier)
        self.retention = PostgresRetention(self.db)

    async def claim_queued(
        self,
        *,
        owner: str,
        ttl: timedelta,
        limit: int,
        flows: Sequence[str] | None,
        now: datetime | None,
    ) -> list[tuple[Lease, History]]:
        """``QueueClaims``: a page of Pending instances leased and opened in one statement."""
        return await claim_queued(self.db, owner=owner, ttl=ttl, limit=limit, flows=flows, now=now)

    async def create_leased(
        self, instance: NewInstance, *, owner: str, ttl: timedelta, now: datetime | None
    ) -> tuple[Lease | None, CreateResult | None]:
        """``LeasedCreate``: lease and instance in one statement."""
        return await self.journal.create_leased(instance, owner=owner, ttl=ttl, now=now)

    async def open(self) -> None:
        await self.db.open(migrate=self._migrate)
        try:
            await self.journal.warm()
        except BaseException:
            await self.db.close()
            raise

    async def create_roles(
        self, *, prefix: str | None = None, grants: Sequence[tuple[str, str]] = ()
    ) -> dict[str, Any]:
        """Create this schema's least-privilege group roles (``flowx migrate --roles``,
        R9.8), hand the schema to the owner role and grant the others; then make each
        ``(kind, login)`` of ``grants`` a member and set its timeouts. Idempotent, one
        transaction, serialised with migrations. Needs a superuser, or a login with
        CREATEROLE that owns the schema."""
        chosen = check_prefix(prefix if prefix is not None else self.db.schema)
        checked = check_grants(grants)
        async with self.db.connection(bounded=False) as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            roles = await create_roles(conn, self.db.schema, chosen)
            logins = await grant_logins(conn, chosen, checked)
        return {"roles": roles, "logins": logins}

    async def wait_work(self, timeout: float) -> bool:
        """``WorkWakeups``: wait for another process's NOTIFY that an instance became
        runnable; ``False`` after ``timeout`` without one."""
        return await self._work_listener.wait(timeout)

    async def close(self) -> None:
        await self.notifier.close()
        await self.work_notifier.close()
        await self._work_listener.close()
        await self.journal.close()
        await self.outbox.close()
        await self.leases.close()
        await self.db.close()

    def describe(self) -> str:
        return f"{redact(self.db.dsn)} (schema {self.db.schema})"

    def bound_round_trips(self, seconds: float) -> None:
        """``RoundTripBound``: no block of round trips waits longer than ``seconds``."""
        self.db.round_trip_timeout = min(self.db.round_trip_timeout or seconds, seconds)

    async def store_clock(self) -> list[tuple[str, datetime]]:
        """``StoreClock``: leases, recovery and ``updated_at`` all use this server's clock."""
        return [(self.db.where(), await self.db.server_time())]

    async def schema_version(self) -> int | None:
        return await self.db.schema_version()
