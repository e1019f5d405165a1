"""A journal sharded by tenant over three PostgreSQL primaries (R6.2, R9.9).

The store conformance suites run through the router too (``tests/conformance/test_stores.py``,
the ``sharded`` variant). Here: where ids and rows land (checked on each cluster directly, not
through the router), that reads across shards are the same as one database's, the URL form
and the CLI over it, and the placement arithmetic's promises (stable, growth moves a tenant
only to the new shard).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import psycopg
import pytest
from pydantic import BaseModel

import flowx
from flowx.api import create_app
from flowx.hosting.stores import split_sharded
from flowx.stores.errors import JournalUnavailable
from flowx.stores.placement import place, shard_of, tenant_shard
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceState
from flowx.stores.sharded import ShardedStores
from flowx.stores.sharded.fanout import Router
from flowx.testing.conformance._support import at, commit, event, instance, step
from flowx.urls import BadURL
from tests.cli.runner import invoke
from tests.support.servers import ThrowawayPostgres


class Work(BaseModel):
    tenant: str | None = None
    n: int = 0


class ChildState(BaseModel):
    x: int | None = None


class WorkState(BaseModel):
    a: int | None = None
    child: ChildState | None = None
    b: int | None = None


@flowx.capability("shard.add", version="1.0.0")
async def add(ctx: flowx.StepContext, work: Work) -> int:
    return work.n + 1


child_flow = (
    flowx.flow("shard.child", version="1", input=Work, state=ChildState).step(add, into="x").build()
)
work_flow = (
    flowx.flow(
        "shard.work", version="1", input=Work, state=WorkState, partition_key=lambda w: w.tenant
    )
    .step(add, into="a")
    .sub_flow(child_flow, lambda w, s: Work(n=w.n + 10), into="child")
    .step(add, into="b", name="again")
    .build()
)


def tenants_per_shard(shards: int, each: int) -> list[str]:
    """``each`` tenants for every shard, as the hash places them."""
    chosen: dict[int, list[str]] = {i: [] for i in range(shards)}
    n = 0
    while any(len(v) < each for v in chosen.values()):
        tenant = f"tenant-{n}"
        n += 1
        picked = chosen[tenant_shard(tenant, shards)]
        if len(picked) < each:
            picked.append(tenant)
    return [t for v in chosen.values() for t in v]


def rows_on(cluster: ThrowawayPostgres, schema: str) -> list[tuple[str, str | None, str | None]]:
    """``(instance_id, tenant_id, parent_instance_id)`` of every instance on one cluster, read
    straight from it: what the router says is not the evidence."""
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        rows = conn.execute(
            f'SELECT instance_id::text, tenant_id, parent_instance_id::text FROM "{schema}".'  # type: ignore[arg-type]
            "flow_instance"
        ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


@pytest.fixture
async def sharded_host(
    pg_shards: list[ThrowawayPostgres],
) -> AsyncIterator[tuple[flowx.FlowHost, ShardedStores, str]]:
    schema = f"flowx_s_{uuid.uuid4().hex[:12]}"
    store = flowx.sharded([c.dsn for c in pg_shards], schema=schema)
    assert isinstance(store, ShardedStores)
    host = flowx.FlowHost(flows=[work_flow, child_flow], store=store)
    await host.open()
    try:
        yield host, store, schema
    finally:
        await host.drain(timeout=5)


# -- placement arithmetic (no server) --------------------------------------------------------


def test_a_placed_id_names_its_shard_and_stays_a_uuid() -> None:
    for shard in (0, 1, 2, 255):
        base = str(uuid.uuid4())
        placed = place(base, shard)
        assert shard_of(placed) == shard
        assert uuid.UUID(placed).version == 8
        assert place(base, shard) == placed  # deterministic: racing starts meet on one id
        assert place(placed, shard) == placed
    assert shard_of(str(uuid.uuid4())) is None  # never placed: shard 0's, by the router
    assert shard_of(str(uuid.uuid5(uuid.NAMESPACE_URL, "x"))) is None
    assert shard_of("not-a-uuid") is None
    with pytest.raises(ValueError, match="out of range"):
        place(str(uuid.uuid4()), 256)


def test_an_id_placed_past_the_shards_is_refused_with_what_to_do() -> None:
    router = Router(2)
    assert router.shard(str(uuid.uuid4())) == 0
    assert router.shard(place(str(uuid.uuid4()), 1)) == 1
    with pytest.raises(JournalUnavailable, match="has 2 shards; name every shard"):
        router.shard(place(str(uuid.uuid4()), 2))


def test_tenants_spread_and_a_new_shard_takes_tenants_only_from_the_others() -> None:
    tenants = [f"t{i}" for i in range(3000)]
    three = {t: tenant_shard(t, 3) for t in tenants}
    assert set(three.values()) == {0, 1, 2}
    assert all(abs(list(three.values()).count(i) - 1000) < 150 for i in range(3))
    four = {t: tenant_shard(t, 4) for t in tenants}
    moved = [t for t in tenants if four[t] != three[t]]
    assert moved and all(four[t] == 3 for t in moved)  # only to the new shard
    assert len(moved) < 1000  # about a quarter, never most
    assert tenant_shard(None, 3) == tenant_shard("", 3)
    pinned = next(t for t in tenants if three[t] != 2)
    assert tenant_shard(pinned, 3, {pinned: 2}) == 2


def test_the_sharded_url_splits_on_urls_not_on_libpq_host_lists() -> None:
    url = "sharded:postgresql://u@h1,h2:5432/db?flowx_schema=a,postgres://u@h3/db"
    assert split_sharded(url) == [
        "postgresql://u@h1,h2:5432/db?flowx_schema=a",
        "postgres://u@h3/db",
    ]
    with pytest.raises(BadURL, match="is not a shard URL"):
        split_sharded("sharded:mysql://u:s3cret@h/db")
    with pytest.raises(BadURL) as refused:
        flowx.sharded(["postgresql://u:s3cret@h/db", "postgresql://u:s3cret@h/db"])
    assert "each shard is its own database" in str(refused.value)
    assert "s3cret" not in str(refused.value)
    with pytest.raises(BadURL, match="sharded by 'tenant'"):
        flowx.sharded(["postgresql://h/db"], by="flow")
    with pytest.raises(BadURL, match="pinned to shard 5"):
        flowx.sharded(["postgresql://h/db"], pins={"acme": 5})


# -- a host on three shards ------------------------------------------------------------------


async def test_instances_land_on_their_tenants_shards_and_reads_merge(
    sharded_host: tuple[flowx.FlowHost, ShardedStores, str],
    pg_shards: list[ThrowawayPostgres],
) -> None:
    host, store, schema = sharded_host
    tenants = tenants_per_shard(3, 2)
    handles = [
        await host.start(work_flow, Work(tenant=t, n=i), idempotency_key=f"k-{t}")
        for i, t in enumerate(tenants)
    ]
    states = await asyncio.gather(*(h.result() for h in handles))
    assert [s.b for s in states] == [i + 1 for i in range(len(tenants))]

    # Each row is on the cluster its tenant hashes to; each child beside its parent.
    seen: dict[str, int] = {}
    for index, cluster in enumerate(pg_shards):
        for iid, tenant, parent in rows_on(cluster, schema):
            seen[iid] = index
            assert tenant is not None and tenant_shard(tenant, 3) == index
            assert shard_of(iid) == index
            if parent is not None:
                assert shard_of(parent) == index
    parents = {h.instance_id for h in handles}
    assert parents <= set(seen) and len(seen) == 2 * len(tenants)  # a child each
    assert {seen[p] for p in parents} == {0, 1, 2}

    # One list across shards is one database's list: newest first, keyset pages agree.
    everything = await store.catalog.list_instances(InstanceQuery(limit=100))
    assert {r.instance_id for r in everything} == set(seen)
    keys = [(r.created_at, r.instance_id) for r in everything]
    assert keys == sorted(keys, reverse=True)
    paged: list[str] = []
    before = None
    while True:
        page = await store.catalog.list_instances(InstanceQuery(limit=5, before=before))
        paged += [r.instance_id for r in page]
        if len(page) < 5:
            break
        before = (page[-1].created_at, page[-1].instance_id)
    assert paged == [r.instance_id for r in everything]
    mine = await store.catalog.list_instances(InstanceQuery(tenant_id=tenants[3]))
    assert len(mine) == 2 and {shard_of(r.instance_id) for r in mine} == {
        seen[handles[3].instance_id]
    }
    counts = await store.catalog.count_instances(InstanceQuery(), by="state")
    assert counts == {"Completed": 2 * len(tenants)}
    by_flow = await store.catalog.count_instances(InstanceQuery(), by="flow")
    assert by_flow == {"shard.child": len(tenants), "shard.work": len(tenants)}

    # The same key and tenant meet on the same id, on the same shard; the key is found.
    again = await host.start(
        work_flow, Work(tenant=tenants[4], n=4), idempotency_key=f"k-{tenants[4]}"
    )
    assert again.instance_id == handles[4].instance_id and not again.created
    found = await store.journal.find_by_key("shard.work", f"k-{tenants[0]}")
    assert found is not None and found.instance_id == handles[0].instance_id


async def test_the_cli_reads_across_shards_through_the_sharded_url(
    sharded_host: tuple[flowx.FlowHost, ShardedStores, str],
    pg_shards: list[ThrowawayPostgres],
) -> None:
    host, _, schema = sharded_host
    tenants = tenants_per_shard(3, 1)
    handles = [await host.start(work_flow, Work(tenant=t)) for t in tenants]
    await asyncio.gather(*(h.result() for h in handles))
    url = "sharded:" + ",".join(f"{c.dsn}?flowx_schema={schema}" for c in pg_shards)

    def cli(*args: str) -> Any:
        code, out, err = invoke(*args, "--db", url, "-o", "json")
        assert code == 0, err
        return json.loads(out)

    listed = await asyncio.to_thread(cli, "list")
    assert {d["instance_id"] for d in listed["instances"]} >= {h.instance_id for h in handles}
    counted = await asyncio.to_thread(cli, "count", "--by", "flow")
    assert counted["counts"] == {"shard.child": 3, "shard.work": 3}
    for handle in handles:
        shown = await asyncio.to_thread(cli, "show", handle.instance_id)
        assert shown["instance"]["instance_id"] == handle.instance_id
        assert shown["steps"][0]["step_name"] == "shard.add"
    state = await host.get(handles[0].instance_id)
    assert state.state is InstanceState.COMPLETED


def test_a_sharded_store_refuses_a_shard_that_is_not_postgresql() -> None:
    with pytest.raises(TypeError, match=r"shard 0 .* is not a PostgreSQL store"):
        ShardedStores([flowx.memory()])
    with pytest.raises(ValueError, match="1 to 256 shards"):
        ShardedStores([])


def test_leases_paired_from_redis_keep_the_journals_placement() -> None:
    """A sharded journal with its leases in Redis (``with_leases``) still places new ids; a
    journal that does not shard keeps them as drawn."""
    urls = ["postgresql://h1/db", "postgresql://h2/db", "postgresql://h3/db"]
    store = flowx.sharded(urls)
    assert isinstance(store, ShardedStores)
    paired = flowx.with_leases(store, flowx.redis_leases("redis://127.0.0.1:6379/0"))
    drawn = str(uuid.uuid4())
    tenant = tenants_per_shard(3, 1)[1]
    assert paired.place(drawn, tenant) == store.place(drawn, tenant)
    assert shard_of(paired.place(drawn, tenant)) == 1
    alone = flowx.with_leases(flowx.memory(), flowx.redis_leases("redis://127.0.0.1:6379/0"))
    assert alone.place(drawn, tenant) == drawn


async def test_the_api_starts_on_the_tenants_shard_and_reads_across_shards(
    pg_shards: list[ThrowawayPostgres],
) -> None:
    token = "sharded-api-token-for-tests"
    store = flowx.sharded([c.dsn for c in pg_shards], schema=f"flowx_s_{uuid.uuid4().hex[:12]}")
    settings = flowx.HostSettings.load(api_token=token, recovery=False, timers=False)
    host = flowx.FlowHost(store=store, flows=[work_flow, child_flow], settings=settings)
    transport = httpx.ASGITransport(app=create_app(host, run_here=True))
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        host,
        httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers) as client,
    ):
        ids = []
        for tenant in tenants_per_shard(3, 1):
            response = await client.post(
                "/v1/flows/shard.work/instances", json={"input": {"tenant": tenant, "n": 1}}
            )
            assert response.status_code == 201, response.text
            iid = response.json()["instance_id"]
            assert shard_of(iid) == tenant_shard(tenant, 3)
            ids.append(iid)
        for iid in ids:
            ended = await client.get(f"/v1/instances/{iid}/result?wait=10")
            assert ended.status_code == 200, ended.text
            shown = (await client.get(f"/v1/instances/{iid}")).json()
            assert shown["instance"]["state"] == "Completed"
        listed = (await client.get("/v1/instances?limit=100")).json()
        assert {d["instance_id"] for d in listed["instances"]} >= set(ids)
        assert len(listed["instances"]) == 2 * len(ids)  # each with its child


async def test_migrate_with_roles_makes_the_same_roles_on_every_shard(
    pg_shards: list[ThrowawayPostgres],
) -> None:
    """``flowx migrate --roles --db sharded:...`` (R9.8): a worker's login must work on
    whichever shard its instances are, so every shard gets the roles."""
    schema = f"flowx_r_{uuid.uuid4().hex[:12]}"
    url = "sharded:" + ",".join(f"{c.dsn}?flowx_schema={schema}" for c in pg_shards)
    code, out, err = await asyncio.to_thread(invoke, "migrate", "--roles", "--db", url)
    assert code == 0, err
    assert f"{schema}_worker" in out
    for cluster in pg_shards:
        with psycopg.connect(cluster.dsn, autocommit=True) as conn:
            found = conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname LIKE %s ORDER BY 1", (f"{schema}_%",)
            ).fetchall()
        names = {r[0] for r in found}
        assert {f"{schema}_{k}" for k in ("owner", "worker", "reader")} <= names


async def test_the_outbox_and_the_change_feed_serve_every_shard_one_at_a_time(
    sharded_schema: Callable[[], ShardedStores],
) -> None:
    """Events staged on all three shards: each claim is one shard's (its order intact), and
    every event goes out; a change consumer reads each shard's events once, its position
    naming the shard."""
    store = sharded_schema()
    await store.open()
    try:
        staged: dict[int, list[str]] = {}
        for shard in range(3):
            iid = place(str(uuid.uuid4()), shard)
            await store.journal.create(instance(iid), token=1, now=at(0))
            events = (event("k"), event("k"))
            await store.journal.commit(commit(iid, token=1, now=1, step=step(1), events=events))
            staged[shard] = [e.event_id for e in events]
        assert await store.changes.subscribe("audit", now=at(2))
        assert await store.outbox.pending_count() == 6
        assert (await store.outbox.backlog()).pending == 6

        claimed: list[list[str]] = []
        for _ in range(4):
            async with store.outbox.claim(limit=10, now=at(3), owner="p1") as claim:
                claimed.append([e.event_id for e in claim.events])
                claim.published(len(claim.events))
        assert sorted(map(tuple, claimed[:3])) == sorted(tuple(v) for v in staged.values())
        assert claimed[3] == []
        assert await store.outbox.pending_count() == 0

        read: list[list[str]] = []
        for _ in range(4):
            batch = await store.changes.read("audit")
            read.append([e.event_id for e in batch.events])
            await store.changes.commit("audit", batch.position, now=at(4))
        assert sorted(map(tuple, read[:3])) == sorted(tuple(v) for v in staged.values())
        assert read[3] == []
    finally:
        await store.close()
