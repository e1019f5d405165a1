"""The stop watches of the instances running on one node (R9.4): how an operator's cancel
or terminate reaches the run that must carry it out — at once from a command on this node,
at the next lease renewal from anywhere else."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from flowx.engine.stops import StopWatch
from flowx.stores.protocols import Stores
from flowx.stores.records import InstanceRecord, StopRequest

log = logging.getLogger("flowx.host")


class StopBoard:
    """The stop watches of the instances running on this node, by id."""

    def __init__(self) -> None:
        self._watches: dict[str, StopWatch] = {}
        # Runs of each instance here: a run that ends must not drop the watch of the next
        # run of the same instance, started a moment before the first one's task finished.
        self._runs: dict[str, int] = {}

    def enter(self, instance_id: str) -> None:
        """A run of ``instance_id`` begins on this node."""
        self._runs[instance_id] = self._runs.get(instance_id, 0) + 1

    def leave(self, instance_id: str) -> None:
        """A run of ``instance_id`` ended; the last one to end drops the watch."""
        left = self._runs.get(instance_id, 1) - 1
        if left > 0:
            self._runs[instance_id] = left
            return
        self._runs.pop(instance_id, None)
        self._watches.pop(instance_id, None)

    def request(self, instance_id: str) -> StopRequest | None:
        """What this node knows an operator asked of ``instance_id`` while it runs here."""
        watch = self._watches.get(instance_id)
        return watch.request if watch is not None else None

    def watch(self, record: InstanceRecord) -> StopWatch:
        """The watch of a run of ``record`` (one per instance while it runs here), holding
        the request the journal already had for it."""
        kept = StopRequest.loads(record.stop_request) if record.stop_request else None
        watch = self._watches.get(record.instance_id)
        if watch is None:
            watch = self._watches[record.instance_id] = StopWatch(kept)
        elif kept is not None:
            watch.tell(kept)
        return watch

    def tell(self, instance_id: str, request: StopRequest) -> bool:
        """Tell the run of ``instance_id`` here, if there is one; ``False`` if there is none."""
        watch = self._watches.get(instance_id)
        if watch is None:
            return False
        if watch.tell(request):
            log.info("instance %s: %s requested by %s", instance_id, request.mode, request.by)
        return True

    async def poll(self, stores: Stores, instance_ids: Sequence[str]) -> None:
        """Read the stop requests of the instances this node renewed leases for, and tell
        their runs: how a request made on another node reaches this one."""
        asked = [
            i
            for i in instance_ids
            if (w := self._watches.get(i)) is not None
            and (w.request is None or w.request.mode != "terminate")
        ]
        if not asked:
            return
        for iid, text in (await stores.stops.stop_requests(asked)).items():
            self.tell(iid, StopRequest.loads(text))
