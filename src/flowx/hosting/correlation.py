"""Which instance a signal by correlation id goes to (issue 18 item 2; R2.10, R6.1).

A correlation id is what a caller started an instance with to find it again (an order number,
a conversation id). It is not unique: nothing stops two starts from carrying the same one, and
a sub-flow child inherits its parent's (``flowx.hosting.creation``). So a signal that names a
correlation id rather than an instance is resolved by one rule, the same for the broker
ingress, ``flowx signal --correlation`` and any other caller:

* exactly one instance with that id has not ended → the signal goes to it;
* several have not ended → ``CorrelationAmbiguous`` naming how many: guessing would wake the
  wrong one, and a signal cannot be taken back;
* none has → the newest that has ended gets the signal, so a keyed redelivery after the end
  is still a ``duplicate`` (its sender gets its success) and an unkeyed one is refused as
  ``InstanceFinished`` — the answers a signal by instance id gets;
* no instance has it at all → ``CorrelationNotFound`` (an ``InstanceNotFound``).

The lookup is the instance list's correlation filter, served by the partial index of
migration 0015 (``flow_instance_correlation_idx``), on every store the catalog runs on; a
sharded store asks every shard and merges.
"""

from __future__ import annotations

from typing import Final

from flowx.errors import CorrelationAmbiguous, CorrelationNotFound
from flowx.stores.protocols import InstanceCatalog, InstanceQuery

__all__ = ["resolve_correlation"]

#: Enough live instances to tell "one" from "several"; the count in the error is exact.
_LIVE_PAGE: Final = 2


async def resolve_correlation(catalog: InstanceCatalog, correlation_id: str) -> str:
    """The id of the instance a signal by ``correlation_id`` goes to (the module's rule).

    Raises ``CorrelationNotFound`` or ``CorrelationAmbiguous``; a store error passes through
    as it is (the caller's retry decides)."""
    live = InstanceQuery(correlation_id=correlation_id, unfinished=True, limit=_LIVE_PAGE)
    found = await catalog.list_instances(live)
    if len(found) == 1:
        return found[0].instance_id
    if found:
        counts = await catalog.count_instances(live, by="state")
        raise CorrelationAmbiguous(correlation_id, max(len(found), sum(counts.values())))
    newest = await catalog.list_instances(InstanceQuery(correlation_id=correlation_id, limit=1))
    if not newest:
        raise CorrelationNotFound(correlation_id)
    return newest[0].instance_id
