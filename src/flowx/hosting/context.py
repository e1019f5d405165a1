"""``NodeContext``: what every part of a node needs, in one object.

The runner, the ports, the services and the facade all read the same stores, clock, settings,
plans, thread pool and "is this node accepting work" flag. Passing one context (instead of the
host itself) lets each part be built and tested on its own, and keeps the host's private
members private. The context also takes leases, since every path that runs an instance takes
one the same way (R2.4, R3.3).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

from flowx.capability import CapabilityRegistry
from flowx.clock import Clock
from flowx.errors import DurabilityNotConfigured, FlowXError
from flowx.hosting.alerts import AlertSink
from flowx.hosting.catalog import PlanCatalog
from flowx.hosting.clock_offset import JournalClock
from flowx.hosting.lease import DurableLease, LeaseKeeper
from flowx.hosting.settings import HostSettings
from flowx.hosting.stop_board import StopBoard
from flowx.hosting.threads import CapabilityThreads
from flowx.outbox import OutboxPublisher
from flowx.sealing import Sealing
from flowx.stores.errors import JournalUnavailable
from flowx.stores.placement import ShardedIds
from flowx.stores.protocols import CommitReleases, LeasedCreate, Stores
from flowx.stores.records import InstanceRecord, Lease


@dataclass(kw_only=True, eq=False)
class NodeContext:
    """One node's shared wiring and its few flags; mutated only by the host's lifecycle."""

    store: Stores | None
    settings: HostSettings
    node_id: str
    clock: Clock
    #: This node's clock moved to the journal's, for scheduling sweeps (R9.2).
    journal_clock: JournalClock
    registry: CapabilityRegistry
    plans: PlanCatalog
    #: Told once per instance that ends CompensationFailed here (SPEC §8).
    alerts: AlertSink
    #: The outbox publisher loop, when the host was given a broker (SPEC §5).
    outbox: OutboxPublisher | None = None
    #: Runs plain-``def`` capabilities; exists while the node is open.
    threads: CapabilityThreads | None = None
    #: Renews every lease this node holds, in one store call per interval (R9.1).
    keeper: LeaseKeeper | None = None
    #: The stop watches of the runs on this node (R9.4), polled with every renewal round.
    stops: StopBoard = field(default_factory=StopBoard)
    accepting: bool = False
    opened: bool = False
    store_ready: bool = False
    #: Why the journal could not be reached at start-up, for the error Durable calls get.
    unreachable_because: str = field(default="")

    def sealing(self, instance_id: str) -> Sealing | None:
        """How this node seals and opens the sensitive members of ``instance_id`` (R9.8):
        ``None`` without keys (a flow that has such members is refused at registration)."""
        keyring = self.settings.keyring
        return None if keyring is None else Sealing(keyring, instance_id)

    # What the stores can do, asked once: an isinstance check against a runtime protocol
    # costs tens of microseconds, and these are asked on every start and every commit.
    @functools.cached_property
    def leased_create(self) -> bool:
        """The stores write a start's lease and row in one write (``LeasedCreate``)."""
        return isinstance(self.store, LeasedCreate)

    @functools.cached_property
    def placement(self) -> ShardedIds | None:
        """The store, when it places new ids on shards (``ShardedIds``, R6.2)."""
        return self.store if isinstance(self.store, ShardedIds) else None

    @functools.cached_property
    def commit_releases(self) -> bool:
        """A terminal commit ends its lease in the same write (``CommitReleases``)."""
        store = self.store
        return isinstance(store, CommitReleases) and store.commit_releases_lease()

    def require_stores(self) -> Stores:
        """The stores, or the error a Durable call gets without them: none configured
        (R2.9), or not reachable since start-up (retryable, R7.1)."""
        if self.store is None:
            raise DurabilityNotConfigured(
                "this host has no journal, so it cannot run a Durable flow; pass "
                "store=flowx.sqlite('flowx.db') to FlowHost, or declare the flow "
                "profile=flowx.Ephemeral if losing it on a crash is acceptable"
            )
        if self.opened and not self.store_ready:
            cause = self.unreachable_because
            raise JournalUnavailable(
                f"the journal ({self.store.describe()}) has not been reachable since this "
                f"node started{f' ({cause})' if cause else ''}; it is reconnecting in the "
                "background, retry later"
            )
        return self.store

    def require_accepting(self) -> None:
        """Refuse new work on a node that is not open, or is draining (R7.2)."""
        if not self.opened:
            raise FlowXError(
                "the host is not open; use `async with FlowHost(...)`", code="host.not_open"
            )
        if not self.accepting:
            raise FlowXError("the host is draining and accepts no new work", code="host.draining")

    # -- leases ----------------------------------------------------------------------------

    async def take_lease(self, stores: Stores, record: InstanceRecord) -> DurableLease | None:
        """The lease on an existing instance, its token above the journal's fence (R2.4);
        ``None`` if another node holds it."""
        sent = time.monotonic()
        lease = await stores.leases.acquire(
            record.instance_id,
            owner=self.node_id,
            ttl=self.settings.lease_ttl,
            now=self.clock.store_time(),
            floor=record.fence,
        )
        if lease is None:
            return None
        return self.hold(stores, lease, sent)

    def keep_leases(self, stores: Stores) -> LeaseKeeper:
        """The node's one lease keeper, started on first use."""
        if self.keeper is None:
            self.keeper = LeaseKeeper(
                stores.leases,
                ttl=self.settings.lease_ttl,
                renew_every=self.settings.renewal_interval,
                clock=self.clock,
                # A write queued behind others (a slow disk) and then bounded by its deadline
                # is slow, not stuck: only one outstanding for longer than both is stuck.
                stall_after=self.settings.round_trip_timeout
                + self.settings.renewal_interval.total_seconds(),
            ).start()
            self.keeper.on_round = functools.partial(self.stops.poll, stores)
        return self.keeper

    def hold(self, stores: Stores, lease: Lease, sent: float) -> DurableLease:
        """A granted lease, renewed from now on with every other lease of this node."""
        return DurableLease(
            stores.leases,
            lease,
            ttl=self.settings.lease_ttl,
            renew_every=self.settings.renewal_interval,
            clock=self.clock,
            acquired_at_monotonic=sent,
            keeper=self.keep_leases(stores),
        ).start()  # renewed from the moment it is granted, not once the run starts
