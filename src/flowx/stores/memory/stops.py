"""``StopStore`` in memory: cancel and terminate requests (R9.4), over the shared dicts.

Atomic because no method awaits: that is this store's lock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from flowx.stores.memory.data import MemoryData
from flowx.stores.records import STOP_SIGNAL, SignalRecord, StopReceipt, StopRequest
from flowx.stores.stops import TreeRow, receipt, targets, woken


class MemoryStops:
    """``StopStore`` over the same dicts as the rest of the memory store."""

    def __init__(self, data: MemoryData) -> None:
        self._d = data

    def _tree(self, root: str) -> dict[str, TreeRow]:
        d = self._d
        found: dict[str, TreeRow] = {}
        frontier = [root] if root in d.instances else []
        while frontier:
            iid = frontier.pop()
            record = d.instances[iid]
            found[iid] = TreeRow(record.state, record.stop_request)
            frontier.extend(
                r.instance_id
                for r in d.instances.values()
                if r.parent_instance_id == iid and r.instance_id not in found
            )
        return found

    async def request_stop(self, instance_id: str, request: StopRequest) -> StopReceipt:
        d = self._d
        tree = self._tree(instance_id)
        status, chosen, rewake = targets(instance_id, tree, request)
        for iid in rewake:
            record = d.instances[iid]
            d.instances[iid] = dataclasses.replace(
                record, state=woken(record.state), updated_at=request.at
            )
        text = request.dumps()
        for iid in chosen:
            record = d.instances[iid]
            after = woken(record.state)
            d.instances[iid] = dataclasses.replace(
                record,
                stop_request=text,
                state=after,
                updated_at=request.at if after is not record.state else record.updated_at,
            )
            if not any(
                s.instance_id == iid and s.name == STOP_SIGNAL and s.key == request.mode
                for s in d.signals
            ):
                d.signal_seq += 1
                d.signals.append(
                    SignalRecord(
                        instance_id=iid,
                        name=STOP_SIGNAL,
                        seq=d.signal_seq,
                        key=request.mode,
                        payload=text,
                        received_at=request.at,
                    )
                )
        return receipt(instance_id, tree, request, status, chosen + rewake)

    async def stop_requests(self, instance_ids: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for iid in instance_ids:
            record = self._d.instances.get(iid)
            if record is not None and record.stop_request is not None:
                out[iid] = record.stop_request
        return out
