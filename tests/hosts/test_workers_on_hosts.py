"""Workers on three hosts: one killed, one partitioned, nothing lost and no write past a fence
(issue 18; R1.1, R2.2, R2.4, R3.5, R4.3, R6.1, R7.2, SPEC §8 "node crash", "zombie").

Three ``flowx worker`` processes run in three network namespaces (``tests/support/netns.py``),
each with its own address, its own loopback and nothing but a veth to the test's servers: the
journal, the lease store (PostgreSQL, or in a second run a Redis of the test's own) and the
effect ledger are all reached over it. So nothing here can rest on a shared file, on
localhost or on one process: the nodes meet only in the servers.

A backlog of flows is started from the root namespace. Every worker fills its slots with
instances that have committed ``s1`` and wait in ``s2`` — their effect done, their commit not
(``tests/hosts/host_flows.py``, a gate in the database). Then host A's worker is SIGKILLed and
host B is cut off (silent DROP rules on its veth), and the gate opens. C finishes its own work,
takes over A's and B's instances once their leases run out, and runs the backlog. B stays cut
off until C has committed the step B was in on every one of B's instances; then B is healed:
its steps, held through the partition, finish and try to commit under the tokens they started
with — a write past a fence, if the journal let it land. Each is refused and B aborts each run
without compensating (R3.5). A second, gated wave then fills B's slots and C's: the healed
host works again.

The checks are the chaos rig's (``benchmarks/rig/checks.py``), in SQL over the journal and the
ledger once every instance has settled: every instance Completed; every step committed exactly
once; every committed row has its effect; the effects with no commit are exactly the ones the
two faults cut off, one for each instance A and B held (R4.3); no compensation ran; no write
past a fence — by the database's own audit (a trigger noting each step row's writer against
the instance's lease owner, with leases in PostgreSQL) and by the rig's zombie check (no effect
B made before the cut committed after another node's commit); the killed and the partitioned
hosts' instances were finished by another host (two node ids on their step rows); the two
surviving workers drain on SIGTERM and exit 0 (R7.2).
"""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import cast

import pytest
from redis import Redis

import flowx
from tests.hosts.cluster import (
    JOURNAL,
    Worker,
    prepare_ledger,
    sql,
    start_journal,
    start_worker,
    wait_ready,
)
from tests.hosts.host_flows import Order, order
from tests.support.netns import NetworkHosts, hosts_or_skip
from tests.support.polling import until_sync
from tests.support.servers import ServerUnavailable, ThrowawayPostgres, ThrowawayRedis

pytestmark = [pytest.mark.crash, pytest.mark.timeout(170)]

NAMES = ("a", "b", "c")
INSTANCES = 60
#: Flows a worker runs at once: every worker's slots are full while the gate is closed.
SLOTS = 6
#: Short, so a lease runs out within seconds; long enough for a loaded 2-core machine.
TTL = 3.0
SETTINGS = [
    "--lease-ttl", f"{TTL:g}s",
    "--recovery-scan-interval", "300ms",
    "--max-concurrent-flows", str(SLOTS),
    "--timer-poll-interval", "500ms",
    "--no-retention",
]  # fmt: skip
STEPS = ("s1", "s2", "s3")


@pytest.fixture
def net() -> Iterator[NetworkHosts]:
    """Hosts a, b and c, or a skip naming what this machine lacks (root, ip, a firewall)."""
    with hosts_or_skip(NAMES) as hosts:
        yield hosts


@pytest.fixture
def journal(net: NetworkHosts) -> Iterator[ThrowawayPostgres]:
    try:
        pg = start_journal(net)
    except ServerUnavailable as e:
        pytest.skip(str(e))
    try:
        yield pg
    finally:
        pg.destroy()


@pytest.fixture(params=["postgres", "redis"])
def leases(request: pytest.FixtureRequest, net: NetworkHosts) -> Iterator[ThrowawayRedis | None]:
    """Leases in the journal, or in a Redis of the test's own reached over the veths too."""
    if request.param == "postgres":
        yield None
        return
    try:
        redis = ThrowawayRedis(also_on=tuple(net.gateways))
    except ServerUnavailable as e:
        pytest.skip(str(e))
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()


async def _migrate(db: str) -> None:
    stores = flowx.from_url(db)
    await stores.open()
    await stores.close()


async def _submit(db: str, leases: str | None, wave: int, count: int) -> list[str]:
    """A backlog, queued from the root namespace by a node that runs nothing itself."""
    settings = flowx.HostSettings.load(
        recovery=False, timers=False, retention=False, node_id="submitter"
    )
    stores = flowx.from_url(db, leases=leases)
    async with flowx.FlowHost(store=stores, flows=[order], settings=settings) as host:
        return [
            (
                await host.start(
                    order,
                    Order(n=i, wave=wave),
                    idempotency_key=f"hosts-{wave}-{i}",
                    run_here=False,
                )
            ).instance_id
            for i in range(count)
        ]


def _parked(pg: ThrowawayPostgres, among: list[str]) -> dict[str, set[str]]:
    """Per node: instances of ``among`` whose ``s2`` effect it made and nobody committed."""
    rows = sql(
        pg,
        "SELECT l.node, l.instance_id::text FROM ledger l WHERE l.step = 's2' "
        "AND l.instance_id = ANY(%s::uuid[]) AND NOT EXISTS (SELECT 1 FROM flow_step s "
        "WHERE s.instance_id = l.instance_id AND s.step_name = 's2')",
        among,
    )
    held: dict[str, set[str]] = {}
    for node, instance in rows:
        held.setdefault(node, set()).add(instance)
    return held


def _filled(pg: ThrowawayPostgres, among: list[str], workers: list[Worker]) -> bool:
    parked = _parked(pg, among)
    return all(len(parked.get(w.node, ())) >= SLOTS for w in workers)


def _s2_by(pg: ThrowawayPostgres, instances: set[str]) -> dict[str, str]:
    """Who committed ``s2``, per instance of ``instances`` where someone has."""
    rows = sql(
        pg,
        "SELECT instance_id::text, node_id FROM flow_step WHERE step_name = 's2' "
        "AND instance_id = ANY(%s::uuid[])",
        sorted(instances),
    )
    return dict(rows)


def _aborted(worker: Worker, instances: set[str]) -> set[str]:
    text = worker.log_text()
    return {i for i in instances if f"instance {i}: aborting without compensation" in text}


def _unpublished(pg: ThrowawayPostgres) -> int:
    return int(sql(pg, "SELECT count(*) FROM outbox_event WHERE published_at IS NULL")[0][0])


def _streamed(redis: ThrowawayRedis) -> list[tuple[str, str]]:
    """``(event_id, instance_id)`` of every entry the publishers added to the stream."""
    client = Redis.from_url(redis.url, decode_responses=True)
    try:
        entries = cast("list[tuple[str, dict[str, str]]]", client.xrange("flowx:events:_"))
    finally:
        client.close()
    return [(fields["event_id"], fields["instance_id"]) for _, fields in entries]


def _completed(pg: ThrowawayPostgres) -> int:
    return int(sql(pg, "SELECT count(*) FROM flow_instance WHERE state = 'Completed'")[0][0])


def test_a_killed_and_a_partitioned_host_lose_nothing_and_write_nothing_past_a_fence(
    net: NetworkHosts,
    journal: ThrowawayPostgres,
    leases: ThrowawayRedis | None,
    tmp_path: Path,
) -> None:
    pg = journal
    db = f"{pg.dsn}?flowx_schema={JOURNAL}"
    asyncio.run(_migrate(db))
    prepare_ledger(pg)
    # Each host reaches the servers at its gateway, and nothing at its own loopback.
    ports = [pg.port] + ([leases.port] if leases else [])
    for name, port in ((n, p) for n in NAMES for p in ports):
        assert net.connect_ex(name, net[name].gateway, port) == 0, f"host {name}: no server"
        assert net.connect_ex(name, "127.0.0.1", port) != 0, f"host {name} shares a loopback"

    leases_url = leases.url if leases is not None else None

    def settings(name: str) -> list[str]:
        if leases is None:
            return SETTINGS
        redis = f"redis://{net[name].gateway}:{leases.port}/0"
        return [*SETTINGS, "--leases", redis, "--publish", redis]

    workers = {n: start_worker(net, n, pg, tmp_path, settings(n)) for n in NAMES}
    a, b, c = workers["a"], workers["b"], workers["c"]
    try:
        wait_ready(list(workers.values()))
        first = asyncio.run(_submit(db, leases_url, 1, INSTANCES))
        until_sync(
            lambda: _filled(pg, first, [a, b, c]),
            within=60,
            what=f"every worker holding {SLOTS} instances in s2",
        )
        parked = _parked(pg, first)
        held = {a.node: parked[a.node], b.node: parked[b.node]}
        cut_off = held[a.node] | held[b.node]

        assert a.kill() == -signal.SIGKILL
        partitioned_at: datetime = sql(pg, "SELECT clock_timestamp()")[0][0]
        net.partition("b")
        sql(pg, "UPDATE gate SET open = true WHERE wave = 1")
        until_sync(
            lambda: _s2_by(pg, cut_off).keys() == cut_off,
            within=60,
            what="host C committing s2 on every instance A and B held",
        )
        net.heal("b")
        # B's held steps finish after the heal and commit under their old tokens: refused.
        until_sync(
            lambda: _aborted(b, held[b.node]) == held[b.node],
            within=60,
            what="host B aborting each run it held when it was cut off",
        )
        until_sync(lambda: _completed(pg) == INSTANCES, within=60, what="the first wave done")
        # B, healed, takes work again: a second wave fills B's slots and C's.
        second = asyncio.run(_submit(db, leases_url, 2, 2 * SLOTS))
        until_sync(
            lambda: _filled(pg, second, [b, c]),
            within=60,
            what=f"hosts B and C each holding {SLOTS} instances of the second wave",
        )
        rejoined = _parked(pg, second)[b.node]
        sql(pg, "UPDATE gate SET open = true WHERE wave = 2")
        total = INSTANCES + 2 * SLOTS
        until_sync(lambda: _completed(pg) == total, within=60, what="every instance Completed")
        if leases is not None:  # the workers publish: every event goes out, whoever staged it
            until_sync(
                lambda: _unpublished(pg) == 0, within=60, what="every event published to Redis"
            )
        codes = {w.node: w.stop() for w in (b, c)}
    finally:
        for w in workers.values():
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
    logs = {w.node: w.log_text() for w in workers.values()}
    assert codes == {b.node: 0, c.node: 0}, logs  # drained and exited (R7.2)

    # Every instance Completed; every step committed exactly once, with its effect (R2.2).
    states = sql(pg, "SELECT state, count(*) FROM flow_instance GROUP BY state")
    assert states == [("Completed", total)]
    ids = {r[0] for r in sql(pg, "SELECT instance_id::text FROM flow_instance")}
    assert ids == set(first) | set(second)
    rows = sql(
        pg,
        "SELECT count(*) FILTER (WHERE outcome = 'Success'), "
        "count(*) FILTER (WHERE outcome <> 'Success'), "
        "count(DISTINCT (instance_id, scope, step_id)) FROM flow_step",
    )
    nodes_per_flow = len(STEPS) + 1  # the steps and the emit
    assert rows == [(total * nodes_per_flow, 0, total * nodes_per_flow)]
    unbacked = sql(
        pg,
        "SELECT count(*) FROM flow_step s LEFT JOIN ledger l ON l.effect_id::text = "
        "(s.result::json #>> '{}') AND l.instance_id = s.instance_id AND l.step = s.step_name "
        "WHERE s.step_name = ANY(%s) AND l.effect_id IS NULL",
        list(STEPS),
    )
    assert unbacked == [(0,)]
    # One event per instance, staged with its commit: none from a refused one (R2.3).
    events = sql(pg, "SELECT event_id::text, instance_id::text FROM outbox_event")
    assert sorted(i for _, i in events) == sorted(ids)
    # The effects with no commit: exactly one per instance a fault cut off mid-step (R4.3).
    orphans = sql(
        pg,
        "SELECT l.instance_id::text, l.step, l.node FROM ledger l WHERE NOT EXISTS "
        "(SELECT 1 FROM flow_step s WHERE (s.result::json #>> '{}') = l.effect_id::text)",
    )
    expected = sorted((i, "s2", node) for node, ids in held.items() for i in ids)
    assert sorted(orphans) == expected, "an effect lost or repeated beyond the two faults"
    assert sql(pg, "SELECT count(*) FROM ledger WHERE step = 'undo'") == [(0,)]  # R3.5

    # No write past a fence. The database saw every step row; with leases in the journal it
    # knows each instance's lease owner, and every row was written by it.
    audit = sql(
        pg,
        "SELECT count(*), count(*) FILTER (WHERE lease_owner IS DISTINCT FROM node_id) "
        "FROM fence_audit",
    )
    assert audit[0][0] == total * nodes_per_flow
    if leases is None:
        assert audit[0][1] == 0, sql(pg, "SELECT * FROM fence_audit WHERE lease_owner <> node_id")
    # The rig's zombie check: no effect B made before the cut committed after another node
    # had committed on that instance since.
    zombie = sql(
        pg,
        "WITH c AS (SELECT s.instance_id, s.committed_at, s.node_id, l.at FROM flow_step s "
        "JOIN ledger l ON l.effect_id::text = (s.result::json #>> '{}')) "
        "SELECT count(*) FROM c z WHERE z.node_id = %s AND z.at < %s AND EXISTS "
        "(SELECT 1 FROM c p WHERE p.instance_id = z.instance_id AND p.node_id <> z.node_id "
        "AND p.committed_at > %s AND p.committed_at < z.committed_at)",
        b.node,
        partitioned_at,
        partitioned_at,
    )
    assert zombie == [(0,)]
    # At least one of B's late commits reached the journal and was refused there (R2.4): the
    # cut-off runs did not just run out of lease before writing.
    refused = re.findall(r"aborting without compensation: write to instance", logs[b.node])
    assert refused, logs[b.node]

    # The killed and the partitioned hosts' instances were finished by another host; the
    # healed one ran the second wave's instances it took.
    nodes = dict(
        sql(
            pg,
            "SELECT instance_id::text, array_agg(DISTINCT node_id) FROM flow_step "
            "GROUP BY instance_id",
        )
    )
    for node, ids in held.items():
        for i in ids:
            assert node in nodes[i] and len(nodes[i]) > 1, (i, nodes[i])
    assert set(_s2_by(pg, rejoined).values()) == {b.node}
    share = dict(sql(pg, "SELECT node_id, count(*) FROM flow_step GROUP BY node_id"))
    duplicates = 0
    if leases is not None:
        # Through the broker, over the veths: every event at least once (R5.2), as staged.
        streamed = _streamed(leases)
        assert set(streamed) == set(events)
        duplicates = len(streamed) - len(events)
    print(
        f"leases in {'redis' if leases else 'postgres'}: step commits by node {share}; "
        f"host B: {len(refused)} of its {len(held[b.node])} cut-off runs had a late commit "
        f"refused by the fence; events published twice: {duplicates}"
    )
