"""The SQLite journal, lease store, recovery index and catalog, over one ``SqliteDatabase``.

Every write runs inside a ``BEGIN IMMEDIATE`` transaction (``SqliteDatabase.write``, which
group-commits concurrent writes): it takes the file's write lock up front, so two processes
never both read the fence and then both write — the lock is SQLite's equivalent of the row lock
under which PostgreSQL checks the fence.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from flowx.clock import or_process_now
from flowx.stores.catalog import COUNT_BY, where
from flowx.stores.columns import (
    ACTIVE_STATES_SQL,
    CANDIDATE_COLUMNS,
    CREATE_COLUMNS,
    EVENT_COLUMNS,
    INSTANCE_COLUMNS,
    STEP_COLUMNS,
)
from flowx.stores.errors import DuplicateStep, FencedOut, UnknownInstance
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import (
    CHILD_WAIT,
    CreateResult,
    EventRecord,
    History,
    InstanceRecord,
    Lease,
    NewInstance,
    RecoveryCandidate,
    StepCommit,
    StepRecord,
)
from flowx.stores.renewal import renew_one
from flowx.stores.sqlite.database import SqliteDatabase, from_text, to_text
from flowx.stores.sqlite.leasing import (
    FENCE_OF,
    RAISE_FENCE,
    SELECT_STEPS,
    acquire_in,
    claim_queued_in,
    open_in,
    release_in,
)
from flowx.stores.sqlite.outbox import SqliteChanges, SqliteOutbox
from flowx.stores.sqlite.retention import SqliteRetention
from flowx.stores.sqlite.rows import (
    SELECT_INSTANCE,
    candidates,
    event_row,
    instance_row,
    read_instance,
    step_row,
)
from flowx.stores.sqlite.stops import SqliteStops
from flowx.stores.sqlite.waits import SqliteWaits

# flow_instance_idempotency_idx.
_SELECT_BY_KEY: Final = (
    f"SELECT {INSTANCE_COLUMNS} FROM flow_instance WHERE flow_id = ? AND idempotency_key = ?"
)


def create_in(
    conn: sqlite3.Connection, instance: NewInstance, token: int, now: datetime | None
) -> CreateResult:
    """Insert the instance row inside the caller's write transaction."""
    row = conn.execute(SELECT_INSTANCE, (instance.instance_id,)).fetchone()
    if row is None and instance.idempotency_key is not None:
        row = conn.execute(_SELECT_BY_KEY, (instance.flow_id, instance.idempotency_key)).fetchone()
    if row is not None:
        return CreateResult(instance=instance_row(row), created=False)
    stamp = to_text(or_process_now(now))  # read under the write lock
    conn.execute(
        f"INSERT INTO flow_instance ({CREATE_COLUMNS}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            instance.instance_id,
            instance.flow_id,
            instance.flow_version,
            instance.tenant_id,
            instance.state.value,
            token,
            instance.input,
            instance.state_bag,
            instance.idempotency_key,
            instance.correlation_id,
            to_text(instance.deadline_at) if instance.deadline_at else None,
            instance.parent_instance_id,
            instance.parent_scope,
            instance.parent_step_id,
            instance.codec_version,
            stamp,
            stamp,
            instance.trace_context,
        ),
    )
    created = read_instance(conn, instance.instance_id)
    assert created is not None  # nosec B101  # invariant: written above, in this transaction
    return CreateResult(instance=created, created=True)


# A child's terminal commit wakes its parent if the parent is Suspended waiting for this very
# child (StepCommit.notify_parent), in the commit's own write. Both primary key.
_PARENT_OF: Final = (
    "SELECT parent_instance_id, parent_step_id, parent_scope FROM flow_instance "
    "WHERE instance_id = ?"
)
_WAKE_PARENT: Final = (
    "UPDATE flow_instance SET state = 'Pending', updated_at = ?, version = version + 1 "
    "WHERE instance_id = ? AND state = 'Suspended' AND wake_signal = ? "
    "AND wake_step_id = ? AND wake_scope = ?"
)


def wake_parent_in(conn: sqlite3.Connection, instance_id: str, now: datetime) -> None:
    """Wake the instance's parent inside the caller's write transaction (no parent: no-op)."""
    row = conn.execute(_PARENT_OF, (instance_id,)).fetchone()
    if row is None or row[0] is None:
        return
    parent, step_id, scope = row
    conn.execute(_WAKE_PARENT, (to_text(now), parent, CHILD_WAIT, step_id, scope))


class SqliteJournal:
    """``FlowJournal`` on the SQLite file."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def create(
        self, instance: NewInstance, *, token: int, now: datetime | None
    ) -> CreateResult:
        return await self._db.write(lambda conn: create_in(conn, instance, token, now))

    async def open(self, instance_id: str, *, token: int, now: datetime | None) -> History:
        return await self._db.write(lambda conn: open_in(conn, instance_id, token, now))

    async def commit(self, commit: StepCommit) -> int | None:
        def tx(conn: sqlite3.Connection) -> int | None:
            sequence = write(conn)  # raises, writing nothing, when the fence refuses it
            if commit.notify_parent:
                wake_parent_in(conn, commit.instance_id, or_process_now(commit.now))
            if commit.release_lease:
                release_in(conn, commit.instance_id, commit.token, or_process_now(commit.now))
            return sequence

        def write(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(
                "SELECT fence, next_sequence FROM flow_instance WHERE instance_id = ?",
                (commit.instance_id,),
            ).fetchone()
            if row is None:
                raise UnknownInstance(commit.instance_id)
            fence, sequence = row
            if commit.token < fence:
                raise FencedOut(commit.instance_id, commit.token, fence)
            stamp = to_text(or_process_now(commit.now))  # read under the write lock
            step = commit.step
            if step is None:
                conn.execute(
                    "UPDATE flow_instance SET state_bag = coalesce(?, state_bag), "
                    "state = coalesce(?, state), error = coalesce(?, error), updated_at = ?, "
                    "version = version + 1 WHERE instance_id = ?",
                    (
                        commit.state_bag,
                        commit.state.value if commit.state else None,
                        commit.error,
                        stamp,
                        commit.instance_id,
                    ),
                )
                return None
            try:
                conn.execute(
                    f"INSERT INTO flow_step ({STEP_COLUMNS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        commit.instance_id,
                        step.scope,
                        step.step_id,
                        step.attempt,
                        sequence,
                        step.step_name,
                        step.outcome.value,
                        step.result,
                        step.capability_id,
                        step.capability_version,
                        step.nondeterministic,
                        step.duration_ms,
                        stamp,
                        step.node_id,
                    ),
                )
            except sqlite3.IntegrityError as exc:
                raise DuplicateStep(
                    commit.instance_id, step.scope, step.step_id, step.attempt
                ) from exc
            conn.execute(
                "UPDATE flow_instance SET next_sequence = ?, "
                "state_bag = coalesce(?, state_bag), "
                "state_bag_sequence = CASE WHEN ? IS NULL THEN state_bag_sequence ELSE ? END, "
                "state = coalesce(?, state), error = coalesce(?, error), resume_count = 0, "
                "updated_at = ?, version = version + 1 WHERE instance_id = ?",
                (
                    sequence + 1,
                    commit.state_bag,
                    commit.state_bag,
                    sequence,
                    commit.state.value if commit.state else None,
                    commit.error,
                    stamp,
                    commit.instance_id,
                ),
            )
            if commit.events:
                conn.executemany(
                    "INSERT INTO outbox_event (event_id, instance_id, sequence, ordinal, type, "
                    "schema_version, partition_key, payload, staged_at, trace_context) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            e.event_id,
                            commit.instance_id,
                            sequence,
                            ordinal,
                            e.type,
                            e.schema_version,
                            e.partition_key,
                            e.payload,
                            stamp,
                            e.trace_context,
                        )
                        for ordinal, e in enumerate(commit.events)
                    ],
                )
            return int(sequence)

        return await self._db.write(tx)

    async def get(self, instance_id: str) -> InstanceRecord | None:
        def q(conn: sqlite3.Connection) -> InstanceRecord | None:
            return read_instance(conn, instance_id)

        return await self._db.run(q)

    async def find_by_key(self, flow_id: str, idempotency_key: str) -> InstanceRecord | None:
        def q(conn: sqlite3.Connection) -> InstanceRecord | None:
            row = conn.execute(_SELECT_BY_KEY, (flow_id, idempotency_key)).fetchone()
            return instance_row(row) if row else None

        return await self._db.run(q)

    async def steps(self, instance_id: str) -> Sequence[StepRecord]:
        def q(conn: sqlite3.Connection) -> Sequence[StepRecord]:
            return tuple(step_row(r) for r in conn.execute(SELECT_STEPS, (instance_id,)))

        return await self._db.run(q)

    async def events(self, instance_id: str) -> Sequence[EventRecord]:
        def q(conn: sqlite3.Connection) -> Sequence[EventRecord]:
            found = conn.execute(
                f"SELECT {EVENT_COLUMNS} FROM outbox_event o WHERE o.instance_id = ? "
                "ORDER BY staged_seq",  # outbox_event_instance_idx
                (instance_id,),
            )
            return tuple(event_row(r) for r in found)

        return await self._db.run(q)


class SqliteLeaseStore:
    """``LeaseStore`` on the ``flow_lease`` table: UPDATE, never DELETE (R3.1)."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def acquire(
        self,
        instance_id: str,
        *,
        owner: str,
        ttl: timedelta,
        now: datetime | None,
        floor: int = 0,
    ) -> Lease | None:
        def tx(conn: sqlite3.Connection) -> Lease | None:
            row = conn.execute(FENCE_OF, (instance_id,)).fetchone()
            fence = row[0] if row is not None else 0
            lease = acquire_in(conn, instance_id, owner, ttl, now, max(floor, fence))
            if lease is not None and row is not None:
                # The fence rises on acquisition (R2.4): from here on a zombie holding an
                # older token is refused, before the new owner has written or read anything.
                conn.execute(RAISE_FENCE, (lease.token, instance_id, lease.token))
            return lease

        return await self._db.write(tx)

    async def renew(self, lease: Lease, *, ttl: timedelta, now: datetime | None) -> Lease:
        return await renew_one(self, lease, ttl=ttl, now=now)

    async def renew_many(
        self, leases: Sequence[Lease], *, ttl: timedelta, now: datetime | None
    ) -> Sequence[Lease | None]:
        """Every lease in one write transaction: one fsync however many there are (R9.1)."""

        def tx(conn: sqlite3.Connection) -> Sequence[Lease | None]:
            moment = or_process_now(now)
            expires, stamp = to_text(moment + ttl), to_text(moment)
            renewed: list[Lease | None] = []
            for lease in leases:
                cur = conn.execute(
                    "UPDATE flow_lease SET expires_at = ? "
                    "WHERE instance_id = ? AND fencing_token = ? AND expires_at > ?",
                    (expires, lease.instance_id, lease.token, stamp),
                )
                renewed.append(
                    dataclasses.replace(lease, expires_at=moment + ttl)
                    if cur.rowcount == 1
                    else None
                )
            return renewed

        return await self._db.write(tx)

    async def release(self, lease: Lease, *, now: datetime | None) -> None:
        def tx(conn: sqlite3.Connection) -> None:
            release_in(conn, lease.instance_id, lease.token, or_process_now(now))

        await self._db.write(tx)

    async def current(self, instance_id: str) -> Lease | None:
        def q(conn: sqlite3.Connection) -> Lease | None:
            row = conn.execute(
                "SELECT owner_node, fencing_token, expires_at FROM flow_lease "
                "WHERE instance_id = ?",
                (instance_id,),
            ).fetchone()
            if row is None:
                return None
            return Lease(
                instance_id=instance_id, owner=row[0], token=row[1], expires_at=from_text(row[2])
            )

        return await self._db.run(q)


class SqliteRecoveryIndex:
    """``RecoveryIndex``: each query reads its partial index in order."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def find_abandoned(
        self, *, now: datetime | None, idle_for: timedelta, limit: int, offset: int = 0
    ) -> Sequence[RecoveryCandidate]:
        return await self._page(
            f"SELECT {CANDIDATE_COLUMNS} "
            "FROM flow_instance INDEXED BY flow_instance_abandoned_idx "
            f"WHERE state IN {ACTIVE_STATES_SQL} AND updated_at < ? "
            "ORDER BY updated_at, instance_id LIMIT ? OFFSET ?",
            (to_text(or_process_now(now) - idle_for), limit, offset),
        )

    async def find_queued(self, *, limit: int, offset: int = 0) -> Sequence[RecoveryCandidate]:
        return await self._page(
            f"SELECT {CANDIDATE_COLUMNS} "
            "FROM flow_instance INDEXED BY flow_instance_queued_idx "
            "WHERE state = 'Pending' ORDER BY updated_at, instance_id LIMIT ? OFFSET ?",
            (limit, offset),
        )

    async def _page(self, sql: str, args: tuple[Any, ...]) -> Sequence[RecoveryCandidate]:
        def q(conn: sqlite3.Connection) -> Sequence[RecoveryCandidate]:
            return candidates(conn, sql, args)

        return await self._db.run(q)


class SqliteCatalog:
    """``InstanceCatalog``: newest first by ``flow_instance_created_idx``, keyset paged."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def list_instances(self, query: InstanceQuery) -> Sequence[InstanceRecord]:
        conditions, params = where(query, lambda name: f":{name}", to_text)
        if query.before is not None:
            conditions.append("(created_at, instance_id) < (:before_at, :before_id)")
            params.update(before_at=to_text(query.before[0]), before_id=query.before[1])
        sql = (
            f"SELECT {INSTANCE_COLUMNS} FROM flow_instance WHERE "
            f"{' AND '.join(conditions) or '1 = 1'} "
            "ORDER BY created_at DESC, instance_id DESC LIMIT :limit"
        )

        def q(conn: sqlite3.Connection) -> Sequence[InstanceRecord]:
            return tuple(
                instance_row(r) for r in conn.execute(sql, {**params, "limit": query.limit})
            )

        return await self._db.run(q)

    async def count_instances(self, query: InstanceQuery, *, by: str) -> dict[str, int]:
        conditions, params = where(query, lambda name: f":{name}", to_text)
        column = COUNT_BY[by]
        sql = (
            f"SELECT {column}, count(*) FROM flow_instance WHERE "
            f"{' AND '.join(conditions) or '1 = 1'} GROUP BY 1 ORDER BY 1"
        )

        def q(conn: sqlite3.Connection) -> dict[str, int]:
            return {str(r[0]): int(r[1]) for r in conn.execute(sql, params)}

        return await self._db.run(q)


#: How often an idle worker looks for another process's commit: the most a start or a signal
#: from another process waits before a worker here notices it.
WORK_POLL = 0.01


class SqliteStores:
    """All four roles over one SQLite file (R1.2)."""

    def __init__(self, path: str | Path, *, migrate: bool = True) -> None:
        self.db = SqliteDatabase(path)
        self._migrate = migrate
        self.journal = SqliteJournal(self.db)
        self.leases = SqliteLeaseStore(self.db)
        self.recovery = SqliteRecoveryIndex(self.db)
        self.catalog = SqliteCatalog(self.db)
        self.outbox = SqliteOutbox(self.db)
        self.changes = SqliteChanges(self.db)
        self.waits = SqliteWaits(self.db)
        self.stops = SqliteStops(self.db)
        self.retention = SqliteRetention(self.db)
        self._seen_version: int | None = None

    async def wait_work(self, timeout: float) -> bool:
        """``WorkWakeups``: ``True`` once another process has committed to the file since the
        last look (``PRAGMA data_version``; this process's own writes go through its one
        connection and do not count), polled every ``WORK_POLL`` seconds.

        Any commit elsewhere counts, not only one that made work: the caller's look is one
        indexed read, and a wake-up missed would cost a whole sweep interval."""
        loop = asyncio.get_running_loop()
        ends = loop.time() + timeout
        if self._seen_version is None:
            self._seen_version = await self.db.data_version()
        while True:
            left = ends - loop.time()
            if left <= 0:
                return False
            await asyncio.sleep(min(WORK_POLL, left))
            version = await self.db.data_version()
            if version != self._seen_version:
                self._seen_version = version
                return True

    async def claim_queued(
        self,
        *,
        owner: str,
        ttl: timedelta,
        limit: int,
        flows: Sequence[str] | None,
        now: datetime | None,
    ) -> list[tuple[Lease, History]]:
        """``QueueClaims``: a page of Pending instances leased and opened in one write."""
        return await self.db.write(
            lambda conn: claim_queued_in(
                conn, owner=owner, ttl=ttl, limit=limit, flows=flows, now=now
            )
        )

    def commit_releases_lease(self) -> bool:
        """``CommitReleases``: the journal keeps the leases, so a terminal commit ends its
        run's lease in its own write."""
        return True

    async def create_leased(
        self, instance: NewInstance, *, owner: str, ttl: timedelta, now: datetime | None
    ) -> tuple[Lease | None, CreateResult | None]:
        """``LeasedCreate``: the lease and the instance in one transaction, one fsync."""

        def tx(conn: sqlite3.Connection) -> tuple[Lease | None, CreateResult | None]:
            moment = or_process_now(now)
            lease = acquire_in(conn, instance.instance_id, owner, ttl, moment, 0)
            if lease is None:
                return None, None
            return lease, create_in(conn, instance, lease.token, moment)

        return await self.db.write(tx)

    async def open(self) -> None:
        await self.db.open(migrate=self._migrate)

    async def close(self) -> None:
        await self.db.close()

    def describe(self) -> str:
        return f"sqlite:///{self.db.shown}"

    async def schema_version(self) -> int | None:
        return await self.db.run(lambda conn: self.db.schema_version())
