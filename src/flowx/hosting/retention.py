"""Retention (R2.13): the sweep that deletes what is past its window, and the archiver that
keeps it elsewhere first.

``retention_policy`` says how long an ended instance is kept, per flow with a ``'*'``
default, per class: ``Completed``, or ``Failed`` (every other end: Failed, TimedOut,
CompensationFailed, Cancelled, Terminated); ``OutboxPublished`` for published events.
``Suspended`` is never swept: a waiting instance has not ended.

One sweep, on one node at a time — it holds a lease on a sweep key (``SWEEP_KEY``) in the
lease store, renewed like any other; a node that finds it held reports ``busy`` — walks each
policy's expired instances oldest first, a bounded page at a time. Of each page, what is held
back (an event not yet published or not yet read by a declared consumer, a parent that has not
ended) is counted and kept; the rest is handed to the archiver, then deleted — exactly the
rows the archiver received (a delete checks each instance is still as it was read). An
archiver that fails ends the sweep before that page is deleted: nothing it did not keep is
gone. Deletes are idempotent, so two sweeps that overlap (a lease lost mid-sweep) still
delete each instance once; at worst a page is archived twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from flowx.hosting.archive import Archiver
from flowx.hosting.context import NodeContext
from flowx.metrics import RETENTION_DELETED, RETENTION_HELD_BACK
from flowx.stores.protocols import Stores
from flowx.stores.records import (
    ExpiredInstance,
    InstanceState,
    RetentionPolicy,
)
from flowx.stores.retention import PARENT_KEPT, UNPUBLISHED, UNREAD

#: The metric label of each reason an expired instance is kept (``flowx.metrics``).
HELD_LABELS = {UNPUBLISHED: "unpublished", UNREAD: "unread", PARENT_KEPT: "parent"}

log = logging.getLogger("flowx.retention")

#: The lease a sweep holds, so one node sweeps at a time (an id no instance can have: a
#: UUIDv5 of its name).
SWEEP_KEY = str(uuid.uuid5(uuid.NAMESPACE_URL, "https://flowx.dev/retention-sweep"))

#: The ended states of each class a policy names.
CLASS_STATES: dict[str, tuple[InstanceState, ...]] = {
    "Completed": (InstanceState.COMPLETED,),
    "Failed": tuple(s for s in InstanceState if s.terminal and s is not InstanceState.COMPLETED),
}


@dataclass(kw_only=True)
class SweepReport:
    """What one sweep did (or, with ``dry_run``, would do)."""

    dry_run: bool = False
    #: Another node held the sweep: this one did nothing.
    busy: bool = False
    deleted: int = 0
    archived: int = 0
    #: Expired instances kept, by the reason each was kept.
    held_back: Counter[str] = field(default_factory=Counter)
    #: Published outbox events deleted, and those kept for a consumer that has not read them.
    outbox_deleted: int = 0
    outbox_held_back: int = 0
    pages: int = 0

    @property
    def held(self) -> int:
        """How many expired instances were kept, whatever the reason: what to look into
        when a journal does not shrink as its policies say it should."""
        return sum(self.held_back.values())


@dataclass(frozen=True, slots=True)
class _Rule:
    """One policy as the sweep applies it."""

    flow_id: str | None  # None: the '*' default, for every flow without a policy of its own
    states: tuple[InstanceState, ...]
    ended_before: datetime
    skip_flows: tuple[str, ...]


def rules(policies: Sequence[RetentionPolicy], now: datetime) -> list[_Rule]:
    """The instance rules of ``policies`` at ``now``: one per policy that has a window."""
    found: list[_Rule] = []
    for state_class, states in CLASS_STATES.items():
        own = {p.flow_id: p for p in policies if p.state_class == state_class and p.flow_id != "*"}
        for policy in own.values():
            if policy.retain_for is not None:
                found.append(_Rule(policy.flow_id, states, now - policy.retain_for, ()))
        default = next(
            (p for p in policies if p.state_class == state_class and p.flow_id == "*"), None
        )
        if default is not None and default.retain_for is not None:
            found.append(_Rule(None, states, now - default.retain_for, tuple(sorted(own))))
    return found


async def sweep(
    stores: Stores,
    *,
    now: datetime,
    archiver: Archiver | None,
    page_size: int,
    dry_run: bool = False,
    keep_going: Callable[[], bool] = lambda: True,
) -> SweepReport:
    """One sweep of ``stores`` at ``now`` (the caller holds the sweep key)."""
    report = SweepReport(dry_run=dry_run)
    policies = await stores.retention.policies()
    for rule in rules(policies, now):
        after: tuple[datetime, str] | None = None
        while keep_going():
            page = await stores.retention.expired(
                flow_id=rule.flow_id,
                states=rule.states,
                ended_before=rule.ended_before,
                skip_flows=rule.skip_flows,
                after=after,
                limit=page_size,
            )
            if not page:
                break
            report.pages += 1
            after = (page[-1].updated_at, page[-1].instance_id)
            free = [e for e in page if e.held_by is None]
            report.held_back.update(e.held_by for e in page if e.held_by is not None)
            if dry_run:
                report.deleted += len(free)
            elif free:
                await _archive_and_delete(stores, archiver, free, report)
            if len(page) < page_size:
                break
    outbox = next(
        (p for p in policies if p.state_class == "OutboxPublished" and p.flow_id == "*"), None
    )
    if not dry_run and outbox is not None and outbox.retain_for is not None and keep_going():
        purged = await stores.changes.purge_published(before=now - outbox.retain_for)
        report.outbox_deleted, report.outbox_held_back = purged.deleted, purged.held_back
    return report


async def _archive_and_delete(
    stores: Stores, archiver: Archiver | None, free: list[ExpiredInstance], report: SweepReport
) -> None:
    if archiver is not None:
        contents = await stores.retention.contents([e.instance_id for e in free])
        await archiver.archive(contents)  # raises: this page is not deleted
        report.archived += len(contents)
    report.deleted += await stores.retention.delete(free)


class RetentionService:
    """A node's retention sweep: on a schedule on workers, or once on demand."""

    def __init__(self, ctx: NodeContext, archiver: Archiver | None) -> None:
        self._ctx = ctx
        self.archiver = archiver

    async def sweep_once(
        self, *, dry_run: bool = False, stop: asyncio.Event | None = None
    ) -> SweepReport:
        """Sweep now, if no other node is sweeping (``busy`` otherwise). It stops between
        pages once its lease is lost or ``stop`` is set (a drain)."""
        ctx = self._ctx
        stores = ctx.require_stores()
        sent = time.monotonic()
        lease = await stores.leases.acquire(
            SWEEP_KEY, owner=ctx.node_id, ttl=ctx.settings.lease_ttl, now=ctx.clock.store_time()
        )
        if lease is None:
            return SweepReport(dry_run=dry_run, busy=True)
        held = ctx.hold(stores, lease, sent)
        try:
            report = await sweep(
                stores,
                now=ctx.clock.store_time() or ctx.clock.now(),
                archiver=self.archiver,
                page_size=ctx.settings.retention_page_size,
                dry_run=dry_run,
                keep_going=lambda: held.live and not (stop is not None and stop.is_set()),
            )
        finally:
            await held.release()
        if not dry_run:
            RETENTION_DELETED.inc((), report.deleted)
            for why, label in HELD_LABELS.items():
                RETENTION_HELD_BACK.set(label, report.held_back.get(why, 0))
        if not dry_run and (report.deleted or report.held or report.outbox_deleted):
            log.info(
                "retention: deleted %d instance(s) (%d archived), kept %d past their window "
                "(%s), deleted %d published event(s)",
                report.deleted,
                report.archived,
                report.held,
                ", ".join(f"{n} for {why}" for why, n in report.held_back.items()) or "none",
                report.outbox_deleted,
            )
        return report

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Sweep every ``retention_sweep_interval`` (± jitter, so a fleet does not sweep in
        lockstep), starting one interval after the node starts. A failed sweep is logged and
        tried again at the next interval."""
        interval = self._ctx.settings.retention_sweep_interval.total_seconds()
        while not stop.is_set():
            wait = interval * (1 + random.uniform(-0.1, 0.1))  # nosec B311  # jitter only
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):  # no task of its own while it waits
                    await stop.wait()
                    return
            await _logged(self.sweep_once(stop=stop))


async def _logged(sweeping: Awaitable[SweepReport]) -> None:
    try:
        await sweeping
    except Exception as exc:  # a sweep is retried next interval; a node never dies of it
        log.warning("retention sweep failed (%s); trying again next interval", exc)


#: Retention windows accepted by ``flowx retention set``: at least a minute, at most ten years.
MIN_WINDOW, MAX_WINDOW = timedelta(minutes=1), timedelta(days=3650)
