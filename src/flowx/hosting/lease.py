"""``DurableLease`` and ``LeaseKeeper``: leases that renew themselves and fail closed.

A lease's token is reachable for *starting work* only while the lease is live (R3.2): after a
renewal is refused, or when no renewal has been confirmed for long enough, reading ``token``
raises ``LeaseLost``, so no capability starts under a lease this node may no longer hold
(R3.5). Liveness is judged on the monotonic clock from the moment a renewal was *sent*, less a
third of the TTL, the clock skew between nodes the design tolerates.

A *write* is different: it carries ``fence_token`` and the journal decides (R2.4). A step whose
capability finished while the lease store could not be reached has done its effect; no other
node can have raised the fence without taking the lease, so refusing the commit locally would
only re-run the effect later for nothing.

Every lease this node holds is renewed by one ``LeaseKeeper`` in one store call per interval
(``LeaseStore.renew_many``), on a connection of the store's own where it has one: renewals
never queue behind step commits for a pooled connection, and a slow disk costs one write per
interval, not one per lease (R9.1).

A lease whose instance has had a journal write outstanding for longer than a round trip may
take (``stall_after``: by default half the TTL; a host adds a renewal interval for the wait
behind other writes) is *not* renewed: the node cannot make progress on it, so
it lets the lease run out and another node takes the instance over within about one TTL
instead of never (R9.1).

A release the store did not answer is sent again (``LeaseKeeper.owe``) until it lands or the
lease runs out by itself: left alone, it would keep its instance from every node for a TTL.

A lease whose acquisition took long (a slow disk makes every write slow) is renewed at once,
not at the next round: its liveness counts from when the acquisition was *sent*, and waiting
a whole interval more could let it run out before its first renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta

from flowx.clock import Clock
from flowx.errors import FlowXError
from flowx.stores.errors import LeaseLost
from flowx.stores.protocols import LeaseStore
from flowx.stores.records import Lease

log = logging.getLogger("flowx.lease")

#: An unanswered release is sent again after this long, then twice as long each time up to
#: ``_OWED_RETRY_CAP`` (seconds): soon after a store is back, without hammering one still down.
_OWED_FIRST_RETRY = 0.1
_OWED_RETRY_CAP = 1.0


class DurableLease:
    """Hold ``lease`` until ``release()``; a ``LeaseKeeper`` renews it every ``renew_every``.

    Built without a keeper, it gets one of its own (tools and tests holding a single lease).
    """

    def __init__(
        self,
        store: LeaseStore,
        lease: Lease,
        *,
        ttl: timedelta,
        renew_every: timedelta,
        clock: Clock,
        acquired_at_monotonic: float | None = None,
        keeper: LeaseKeeper | None = None,
    ) -> None:
        self._store = store
        self._lease = lease
        self._ttl = ttl
        self._margin = ttl.total_seconds() * 2 / 3
        start = acquired_at_monotonic if acquired_at_monotonic is not None else time.monotonic()
        self._live_until = start + self._margin
        #: By then the lease has run out in the store by itself (no renewal sent since).
        self._runs_out = start + ttl.total_seconds()
        self._lost: str | None = None
        self._released = False
        self._keeper = keeper or LeaseKeeper(store, ttl=ttl, renew_every=renew_every, clock=clock)
        self._owns_keeper = keeper is None
        #: Monotonic send times of the journal writes under way under this lease, by a key of
        #: the writer's (``writing``; the step commit, on every step, marks its own).
        self.writes: dict[object, float] = {}

    @property
    def instance_id(self) -> str:
        return self._lease.instance_id

    @property
    def lease(self) -> Lease:
        """The lease as last granted or renewed."""
        return self._lease

    @property
    def live(self) -> bool:
        return self._lost is None and not self._released and time.monotonic() < self._live_until

    @property
    def token(self) -> int:
        """The fencing token, or ``LeaseLost`` if this node may no longer start work."""
        self.check()
        return self._lease.token

    def check(self) -> None:
        """``LeaseLost`` if this node may no longer start work: the run's guard before every
        attempt (a bound method, not a lambda around ``token``: a call fewer a step)."""
        if self._released:
            raise LeaseLost(self._lease.instance_id, self._lease.token, "it was released")
        if self._lost is not None:
            raise LeaseLost(self._lease.instance_id, self._lease.token, self._lost)
        if time.monotonic() >= self._live_until:
            self._lost = "no renewal was confirmed in time"
            raise LeaseLost(self._lease.instance_id, self._lease.token, self._lost)

    @property
    def fence_token(self) -> int:
        """The token a write made under this lease carries; the journal's fence decides
        whether it still counts (R2.4). Refused only once the lease was released here."""
        if self._released:
            raise LeaseLost(self._lease.instance_id, self._lease.token, "it was released")
        return self._lease.token

    def writing(self) -> _Writing:
        """Mark a journal write under way, for the block: one outstanding for longer than the
        renewal interval stops this lease's renewals (see ``stalled``)."""
        return _Writing(self.writes)

    def stalled(self, now_monotonic: float, limit: float) -> bool:
        """A journal write has been outstanding for more than ``limit`` seconds."""
        return any(now_monotonic - sent > limit for sent in self.writes.values())

    def start(self) -> DurableLease:
        self._keeper.keep(self)
        if self._owns_keeper:
            self._keeper.start()
        return self

    def _renewed(self, lease: Lease, sent: float) -> None:
        self._lease = lease
        self._live_until = sent + self._margin
        self._runs_out = sent + self._ttl.total_seconds()

    def _refused(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
            log.warning("lease on %s lost: %s", self._lease.instance_id, reason)

    def _expired_locally(self, now_monotonic: float, why: str) -> bool:
        if now_monotonic >= self._live_until and self._lost is None:
            self._lost = why
            return True
        return False

    async def ended_by_commit(self) -> None:
        """The run's terminal commit ended the lease in its own write
        (``StepCommit.release_lease``): stop renewing; ``release()`` then sends nothing."""
        await self._stop_holding()

    async def _stop_holding(self) -> bool:
        """Stop renewing; ``False`` if that had already happened."""
        if self._released:
            return False
        self._released = True
        self._keeper.drop(self)
        if self._owns_keeper:
            await self._keeper.stop()
        return True

    async def release(self) -> None:
        """Stop renewing and hand the lease back. Idempotent; never raises.

        A release the store did not answer (a restart, a blip) is not left to run out: the
        lease would then keep its instance from every other node for up to a whole TTL (a
        ``Pending`` start for 30 s by default). The node's keeper sends it again until it
        lands or the lease has run out by itself (``LeaseKeeper.owe``). Sending it again is
        safe: a release only ends the lease with this token, so it cannot touch a newer one.
        """
        if not await self._stop_holding():
            return
        if self._lost is None:
            try:
                await self._store.release(self._lease, now=self._keeper.clock.store_time())
            except FlowXError as exc:
                if self._owns_keeper:  # a lone lease (a tool, a test): nothing to retry with
                    log.warning(
                        "lease on %s not released (%s); it will expire", self.instance_id, exc
                    )
                    return
                log.warning("lease on %s not released (%s); retrying", self.instance_id, exc)
                self._keeper.owe(self)

    async def _release_again(self) -> bool:
        """One more try at an owed release; ``True`` once nothing is owed any more."""
        if time.monotonic() >= self._runs_out:
            return True  # it has run out by itself
        try:
            await self._store.release(self._lease, now=self._keeper.clock.store_time())
        except FlowXError:
            return False
        except Exception:
            # Not an outage the store names (a driver error it did not translate, a bug):
            # said loudly, and not sent again; the lease runs out by itself.
            log.exception("lease on %s not released; it will expire", self.instance_id)
            return True
        log.info("lease on %s released on a later try", self.instance_id)
        return True


class LeaseKeeper:
    """Renews every lease of a node, all in one ``renew_many`` call per interval."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        ttl: timedelta,
        renew_every: timedelta,
        clock: Clock,
        stall_after: float | None = None,
    ) -> None:
        self._store = store
        self._ttl = ttl
        self._every = renew_every.total_seconds()
        #: A write outstanding this long has outlived any answer it could get (R9.1).
        self._stall_after = stall_after if stall_after is not None else ttl.total_seconds() / 2
        self.clock = clock
        self._soon = asyncio.Event()
        self._held: dict[int, DurableLease] = {}
        self._task: asyncio.Task[None] | None = None
        self._running = False
        self._renewing = False
        #: Renewal rounds sent, and leases left unrenewed because a write had stalled.
        self.rounds = 0
        self.withheld = 0
        #: Called after each renewal round with the instances renewed: the node reads their
        #: stop requests then (R9.4), one read a round, however many it runs.
        self.on_round: Callable[[Sequence[str]], Awaitable[None]] | None = None
        self._poll: asyncio.Task[None] | None = None
        #: Releases the store did not answer, sent again until they land (``owe``).
        self._owed: dict[int, DurableLease] = {}
        self._owing: asyncio.Task[None] | None = None

    @property
    def stall_after(self) -> float:
        """Seconds a journal write may be outstanding before its lease stops being renewed."""
        return self._stall_after

    def keep(self, lease: DurableLease) -> None:
        self._held[id(lease)] = lease
        if lease._live_until - time.monotonic() < lease._margin - self._every / 2:
            self._soon.set()  # it took long to acquire: renew it now, not a round later
        if self._running and self._task is None:
            self._spawn()

    def drop(self, lease: DurableLease) -> None:
        self._held.pop(id(lease), None)
        if not self._held and self._task is not None and not self._renewing:
            # An idle node runs no renewal loop at all: a parked instance costs it nothing.
            self._task.cancel()
            self._task = None

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def owed(self) -> int:
        """Releases not answered yet and still to be sent again."""
        return len(self._owed)

    def owe(self, lease: DurableLease) -> None:
        """Send ``lease``'s release again, soon and then every second at most, until it lands
        or the lease has run out by itself. All owed releases go out together (one statement
        on PostgreSQL and SQLite, which batch releases; a call each on Redis)."""
        if not self._running:
            return  # the node is stopping: the lease runs out by itself
        self._owed[id(lease)] = lease
        if self._owing is None or self._owing.done():
            self._owing = asyncio.get_running_loop().create_task(
                self._release_owed(), name="flowx-lease-releases", context=contextvars.Context()
            )

    async def _release_owed(self) -> None:
        delay = _OWED_FIRST_RETRY
        while self._owed:
            await asyncio.sleep(delay)
            delay = min(delay * 2, _OWED_RETRY_CAP)
            await self._release_round()

    async def _release_round(self) -> None:
        """Send every owed release once; forget those that landed or ran out."""
        owed = list(self._owed.items())
        done = await asyncio.gather(*(lease._release_again() for _, lease in owed))
        for (key, _), settled in zip(owed, done, strict=True):
            if settled:
                self._owed.pop(key, None)

    def start(self) -> LeaseKeeper:
        """Arm the keeper: from now on it renews while it holds at least one lease."""
        self._running = True
        if self._task is None and self._held:
            self._spawn()
        return self

    def _spawn(self) -> None:
        # A context of its own: started lazily, often inside one instance's span, it works for
        # every instance and must not carry that span (``flowx.tracing``).
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="flowx-lease-keeper", context=contextvars.Context()
        )

    async def stop(self, *, owed_within: float = 0.0) -> None:
        """Stop renewing. Releases still owed get one last try, for at most ``owed_within``
        seconds (a draining node's budget); what is still owed then runs out by itself."""
        self._running = False
        owing, self._owing = self._owing, None
        if owing is not None:
            owing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await owing
        if self._owed and owed_within > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(owed_within):
                    await self._release_round()
        self._owed.clear()
        if self._poll is not None:
            self._poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll  # its own errors are logged inside it
            self._poll = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while self._held:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._every):  # one task, no waiter per event
                    await self._soon.wait()
            self._soon.clear()
            self._renewing = True
            try:
                await self.renew_once()
            finally:
                self._renewing = False
        if self._task is asyncio.current_task():
            self._task = None  # nothing held: the next ``keep`` starts a fresh loop

    async def renew_once(self) -> int:
        """One renewal round; returns how many leases it renewed."""
        sent = time.monotonic()
        due: list[DurableLease] = []
        for held in list(self._held.values()):
            if not held.live:
                continue
            if held.stalled(sent, self._stall_after):
                # R9.1: the instance cannot make progress here; let the lease run out.
                self.withheld += 1
                log.warning(
                    "lease on %s not renewed: a journal write has had no answer for over %.1fs",
                    held.instance_id,
                    self._stall_after,
                )
                continue
            due.append(held)
        if not due:
            return 0
        self.rounds += 1
        try:
            renewed = await self._store.renew_many(
                [d.lease for d in due], ttl=self._ttl, now=self.clock.store_time()
            )
        except FlowXError as exc:
            # Unanswered is not refused: keep trying until each lease runs out locally.
            now = time.monotonic()
            for held in due:
                # It may have landed: the lease may then live until this round's send + TTL.
                held._runs_out = max(held._runs_out, sent + self._ttl.total_seconds())
                if held._expired_locally(now, f"renewal failed until the lease ran out: {exc}"):
                    log.warning("lease on %s lost: %s", held.instance_id, held._lost)
            log.warning("%d lease(s) not renewed (%s); retrying", len(due), exc)
            return 0
        count = 0
        kept: list[str] = []
        for held, lease in zip(due, renewed, strict=True):
            if lease is None:
                held._refused("it expired or a newer lease was issued")
            elif held._lost is None and not held._released:
                held._renewed(lease, sent)
                kept.append(held.instance_id)
                count += 1
        if kept and self.on_round is not None and (self._poll is None or self._poll.done()):
            # Its own task: a read queued behind slow writes (a slow disk) must never hold
            # up the next renewal round. One at a time; a round that finds one still
            # running skips it.
            self._poll = asyncio.get_running_loop().create_task(
                self._read_round(self.on_round, kept), name="flowx-stop-poll"
            )
        return count

    @staticmethod
    async def _read_round(
        on_round: Callable[[Sequence[str]], Awaitable[None]], kept: list[str]
    ) -> None:
        try:
            await on_round(kept)
        except FlowXError as exc:  # a stop request is read again next round
            log.warning("stop requests not read this round: %s", exc)
        except Exception:  # a bug (an unreadable request): said loudly, renewals go on
            log.exception("stop requests not read this round")


class _Writing:
    """One journal write under way (``DurableLease.writing``): a plain class, not a
    generator-based context manager, as it wraps every step commit."""

    __slots__ = ("_writes",)

    def __init__(self, writes: dict[object, float]) -> None:
        self._writes = writes

    def __enter__(self) -> None:
        self._writes[self] = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        del self._writes[self]
