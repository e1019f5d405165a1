"""``LeaseStore.renew`` for stores whose one renewal is a batch of one.

A networked lease store renews a node's leases with one statement per interval
(``renew_many``, R9.1); renewing a single lease is that statement with one row, and a missing
row is the lease lost. Written once here so every such store says the same thing when it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol

from flowx.stores.errors import LeaseLost
from flowx.stores.records import Lease


class RenewsMany(Protocol):
    """The one method ``renew_one`` needs of a lease store."""

    async def renew_many(
        self, leases: Sequence[Lease], *, ttl: timedelta, now: datetime | None
    ) -> Sequence[Lease | None]: ...


async def renew_one(
    store: RenewsMany,
    lease: Lease,
    *,
    ttl: timedelta,
    now: datetime | None,
    lost: str = "it expired or a newer lease was issued",
) -> Lease:
    """Renew ``lease`` through ``store.renew_many``; ``LeaseLost`` (saying ``lost``, the ways
    this store can lose a lease) if it comes back ``None``."""
    renewed = (await store.renew_many([lease], ttl=ttl, now=now))[0]
    if renewed is None:
        raise LeaseLost(lease.instance_id, lease.token, lost)
    return renewed
