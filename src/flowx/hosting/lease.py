"""``DurableLease``: a lease that renews itself and fails closed.

Its token is reachable only while the lease is live (R3.2): after a renewal is refused, or
when no renewal has been confirmed for long enough, reading ``token`` raises ``LeaseLost`` — so
no write can carry a token this node no longer holds. Liveness is judged on the monotonic
clock from the moment a renewal was *sent*, less a third of the TTL, which is the clock skew
between nodes the design tolerates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import timedelta

from flowx.clock import Clock
from flowx.errors import FlowXError
from flowx.stores.errors import LeaseLost
from flowx.stores.protocols import LeaseStore
from flowx.stores.records import Lease

log = logging.getLogger("flowx.lease")


class DurableLease:
    """Hold ``lease`` until ``release()``; renew every ``renew_every``."""

    def __init__(
        self,
        store: LeaseStore,
        lease: Lease,
        *,
        ttl: timedelta,
        renew_every: timedelta,
        clock: Clock,
        acquired_at_monotonic: float | None = None,
    ) -> None:
        self._store = store
        self._lease = lease
        self._ttl = ttl
        self._renew_every = renew_every.total_seconds()
        self._clock = clock
        self._margin = ttl.total_seconds() * 2 / 3
        start = acquired_at_monotonic if acquired_at_monotonic is not None else time.monotonic()
        self._live_until = start + self._margin
        self._lost: str | None = None
        self._released = False
        self._task: asyncio.Task[None] | None = None

    @property
    def instance_id(self) -> str:
        return self._lease.instance_id

    @property
    def live(self) -> bool:
        return self._lost is None and not self._released and time.monotonic() < self._live_until

    @property
    def token(self) -> int:
        """The fencing token, or ``LeaseLost`` if this node may no longer write."""
        if self._released:
            raise LeaseLost(self._lease.instance_id, self._lease.token, "it was released")
        if self._lost is not None:
            raise LeaseLost(self._lease.instance_id, self._lease.token, self._lost)
        if time.monotonic() >= self._live_until:
            self._lost = "no renewal was confirmed in time"
            raise LeaseLost(self._lease.instance_id, self._lease.token, self._lost)
        return self._lease.token

    def start(self) -> DurableLease:
        self._task = asyncio.get_running_loop().create_task(
            self._renew_loop(), name=f"flowx-lease-{self._lease.instance_id}"
        )
        return self

    async def _renew_loop(self) -> None:
        while not self._released and self._lost is None:
            await asyncio.sleep(self._renew_every)
            sent = time.monotonic()
            try:
                self._lease = await self._store.renew(
                    self._lease, ttl=self._ttl, now=self._clock.now()
                )
                self._live_until = sent + self._margin
            except LeaseLost as exc:
                self._lost = exc.reason
                log.warning("lease on %s lost: %s", self._lease.instance_id, exc.reason)
                return
            except FlowXError as exc:
                # Unanswered is not refused: keep trying until the lease runs out locally.
                log.warning("lease on %s not renewed (%s); retrying", self._lease.instance_id, exc)
                if time.monotonic() >= self._live_until:
                    self._lost = f"renewal failed until the lease ran out: {exc}"
                    return

    async def release(self) -> None:
        """Stop renewing and hand the lease back. Idempotent; never raises."""
        if self._released:
            return
        self._released = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._lost is None:
            try:
                await self._store.release(self._lease, now=self._clock.now())
            except FlowXError as exc:
                # The lease expires by itself; recovery then waits one TTL. Nothing is unsafe.
                log.warning(
                    "lease on %s not released (%s); it will expire", self._lease.instance_id, exc
                )
