"""Cancel and terminate in the store (R9.4): the one decision every backend makes.

A stop request reaches an instance and every unfinished descendant (its sub-flow children,
theirs, …) in one write, so a parent's cancel can never leave a child running that nobody
will stop. Each backend reads the tree under its lock and hands the rows here; what to write
is decided once, below, and each backend writes it in its own dialect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flowx.stores.errors import InstanceFinished, UnknownInstance
from flowx.stores.records import InstanceState, StopReceipt, StopRequest

#: The states an instance ends in by a stop: a repeated request for one of these is inert.
STOPPED_STATES = frozenset({InstanceState.CANCELLED, InstanceState.TERMINATED})


@dataclass(frozen=True, slots=True)
class TreeRow:
    """One instance of the tree a request reaches, as read under the lock."""

    state: InstanceState
    stop_request: str | None


def targets(
    root: str, tree: Mapping[str, TreeRow], request: StopRequest
) -> tuple[str, list[str], list[str]]:
    """The request's status, the instances to write it to, in id order — every unfinished
    instance of the tree that the request outranks (``StopRequest.outranks``) — and those
    only to wake: a Suspended or Quarantined one that holds an equal or stronger request not
    yet carried out (it went to sleep, or was set aside, as the request came), made Pending
    again so a repeated command reaches it.

    Raises ``UnknownInstance`` (no root row) or ``InstanceFinished`` (the root ended other
    than by a stop: there is nothing to cancel, and saying so is the honest answer)."""
    if root not in tree:
        raise UnknownInstance(root)
    top = tree[root]
    if top.state.terminal and top.state not in STOPPED_STATES:
        raise InstanceFinished(root, top.state.value)
    # An instance that ended by a stop still passes it on: a child it started in the moment
    # before its run learned of the request is reached by the request repeated.
    chosen = sorted(
        iid
        for iid, row in tree.items()
        if not row.state.terminal
        and request.outranks(StopRequest.loads(row.stop_request) if row.stop_request else None)
    )
    rewake = sorted(
        iid
        for iid, row in tree.items()
        if iid not in chosen
        and row.stop_request is not None
        and row.state in (InstanceState.SUSPENDED, InstanceState.QUARANTINED)
    )
    if top.state.terminal:
        return "ended", chosen, rewake
    return ("requested" if root in chosen else "already"), chosen, rewake


def woken(state: InstanceState) -> InstanceState:
    """The state a request leaves an instance in: a Suspended one becomes Pending, so a node
    takes it and stops it at once instead of at its timer, and so does a Quarantined one (a
    terminate ends it without its code; a cancel waits for the code that can compensate it);
    the rest keep theirs."""
    if state in (InstanceState.SUSPENDED, InstanceState.QUARANTINED):
        return InstanceState.PENDING
    return state


def receipt(
    root: str, tree: Mapping[str, TreeRow], request: StopRequest, status: str, written: list[str]
) -> StopReceipt:
    """What the request did: every unfinished instance of the tree with its state after."""
    after = {iid: (woken(row.state) if iid in written else row.state) for iid, row in tree.items()}
    ordered = [root, *sorted(i for i in after if i != root)]
    return StopReceipt(
        instance_id=root,
        mode=request.mode,
        status=status,
        state=after[root],
        affected=tuple((i, after[i]) for i in ordered if not after[i].terminal),
    )
