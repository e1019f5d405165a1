"""Shared builders for the conformance suites."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from flowx.stores.records import (
    EventWrite,
    NewInstance,
    Outcome,
    StepCommit,
    StepWrite,
    SuspendCommit,
    Wake,
)

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def sharded(stores: Any) -> bool:
    """Whether ``stores`` is a journal sharded over several servers, where no order exists
    across shards (README "Sharding the journal": each shard's ``staged_seq``, outbox claim
    and change-feed batch is its own). A suite adapts an order it expects only for these."""
    from flowx.stores.sharded import ShardedStores

    return isinstance(stores, ShardedStores)


def one_shard(stores: Any) -> dict[str, Any]:
    """Instance fields that keep a test's instances on one shard of a sharded journal: one
    tenant (README "Sharding the journal": order per partition key holds for keys within one
    tenant). Nothing for any other store, so its test is unchanged."""
    return {"tenant_id": "conformance-one-shard"} if sharded(stores) else {}


def same_shard(stores: Any, *instance_ids: str) -> bool:
    """Whether the instances share one server: always, but on a sharded journal only if
    their ids route to one shard (an order across them exists only then)."""
    return not sharded(stores) or len({stores.shard_of(i) for i in instance_ids}) == 1


def each_shard_in_order(stores: Any, got: list[str], expected: list[str]) -> bool:
    """What a sharded scan promises without an order across shards (README "Sharding the
    journal": due timers are each shard's earliest first, interleaved): ``got`` holds, of
    every shard, a prefix of ``expected``'s ids on that shard, in ``expected``'s order."""

    def by_shard(ids: list[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = {}
        for iid in ids:
            groups.setdefault(stores.shard_of(iid), []).append(iid)
        return groups

    wanted = by_shard(expected)
    return all(wanted.get(s, [])[: len(ids)] == ids for s, ids in by_shard(got).items())


def new_id() -> str:
    return str(uuid.uuid4())


def instance(instance_id: str | None = None, **kw: object) -> NewInstance:
    fields: dict[str, object] = {
        "instance_id": instance_id or new_id(),
        "flow_id": "conformance.flow",
        "flow_version": "1.0.0",
        "input": '{"order_id":"o-1"}',
        "state_bag": "{}",
    }
    fields.update(kw)
    return NewInstance(**fields)  # type: ignore[arg-type]


def step(
    step_id: int,
    attempt: int = 1,
    *,
    outcome: Outcome = Outcome.SUCCESS,
    scope: str = "",
    result: str = '"ok"',
) -> StepWrite:
    return StepWrite(
        scope=scope,
        step_id=step_id,
        attempt=attempt,
        step_name=f"step-{step_id}",
        outcome=outcome,
        result=result,
        capability_id="conformance.cap",
        capability_version="1.0.0",
        duration_ms=3,
    )


def event(key: str | None = "k", payload: str = '{"n":1}') -> EventWrite:
    return EventWrite(
        event_id=new_id(),
        type="conformance.happened",
        schema_version="1",
        partition_key=key,
        payload=payload,
    )


def commit(iid: str, *, token: int, now: float, **fields: Any) -> StepCommit:
    """A commit to ``iid`` under ``token`` at ``now`` (seconds after T0); ``fields`` as for
    ``StepCommit`` (``step``, ``state``, ``state_bag``, ``events``, ``notify_parent``...)."""
    return StepCommit(instance_id=iid, token=token, now=at(now), **fields)


async def make_instance(stores: Any, *, token: int = 1, **kw: Any) -> str:
    """Create an instance (``kw`` as for ``instance``) at time 0; its id."""
    created = await stores.journal.create(instance(**kw), token=token, now=at(0))
    iid: str = created.instance.instance_id
    return iid


def suspend_commit(
    iid: str,
    *,
    token: int = 1,
    now: float = 5,
    step_id: int = 2,
    scope: str = "",
    wake_at: float | None = None,
    signal: str | None = None,
    state_bag: str | None = None,
    consumed: tuple[int, ...] = (),
    child: str | None = None,
) -> SuspendCommit:
    """A suspend of ``iid`` at ``now`` (seconds after T0), waking as the arguments say."""
    return SuspendCommit(
        instance_id=iid,
        token=token,
        now=at(now),
        wake=Wake(
            step_id=step_id,
            scope=scope,
            at=at(wake_at) if wake_at is not None else None,
            signal=signal,
        ),
        state_bag=state_bag,
        consumed=consumed,
        child=child,
    )
