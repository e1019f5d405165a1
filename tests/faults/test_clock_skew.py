"""A worker whose wall clock is off, for real (libfaketime), beside workers whose clock is right
(issue 12 item 2; R9.2, SPEC §8 "clock skew").

Leases, renewals, releases, the recovery scan's idle filter and ``updated_at`` are decided on
the store's clock (PostgreSQL ``now()``, Redis ``TIME``), never the node's. So:

- a node ahead by TTL/2 — further than the TTL/3 a node may start with, so it is let start by
  raising ``FLOWX_MAX_CLOCK_OFFSET`` — takes no lease from a live owner; neither does one ahead
  by 1.5 TTL, which would see every lease as expired if it compared them with its own clock;
- a node behind by TTL/2 is not starved: it takes queued work and recovers a dead node's
  instance as soon as that lease runs out on the store's clock, not TTL/2 later;
- a node ahead by TTL/2 that dies has its work recovered about one TTL after it died (its
  lease never ran past TTL on the store's clock), not TTL + skew — including a sub-flow child
  that node had just created;
- a node 2×TTL/3 off, with the default limit, refuses to start with a clear message.

Each arm but the refusal runs on the PostgreSQL journal with its own leases, and with Redis
leases. Times are measured on the store's clock: a watch polls the lease store every 50 ms and
keeps who held each lease, under which token, until when. What each effect really did is in a
ledger outside the journal.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.faults.skew_flows import job, parent
from tests.faults.skew_support import (
    ROOT,
    Backend,
    LeaseWatch,
    Worker,
    effects,
    figure,
    need_faketime,
    skewed_env,
    start_worker,
    wait_until,
)
from tests.postgres_support import PG_DSN
from tests.redis_support import REDIS_URL, drop_redis_prefix

pytestmark = pytest.mark.crash

TTL = 6.0
SCAN = 0.5
SKEW = TTL / 2
#: What a loaded machine may add to a takeover beyond the lease running out and one scan.
#: Below SKEW: a takeover decided on the skewed node's clock would come SKEW late and fail.
SLACK = 1.5


def _seconds(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


@pytest.fixture(params=["postgres", "redis"])
def backend(request: pytest.FixtureRequest, pg_schema: Callable[[], str]) -> Iterator[Backend]:
    """A fresh journal schema; with ``redis``, leases under a fresh Redis key prefix."""
    need_faketime()
    schema = pg_schema()
    if request.param == "postgres":
        yield Backend("postgres", PG_DSN, schema)
        return
    prefix = f"flowx_skew_{uuid.uuid4().hex[:10]}"
    yield Backend(
        "redis",
        PG_DSN,
        schema,
        redis_url=f"{REDIS_URL}?flowx_prefix={prefix}",
        prefix=prefix,
        redis_plain=REDIS_URL,
    )
    asyncio.run(drop_redis_prefix(prefix))


class _Cluster:
    """The workers of one test, stopped (and the watch with them) whatever happens."""

    def __init__(self, work: Path, backend: Backend) -> None:
        self.work = work
        self.backend = backend
        self.workers: list[Worker] = []
        self.watch: LeaseWatch | None = None

    def worker(self, name: str, **kw: object) -> Worker:
        w = start_worker(
            self.work,
            self.backend.db,
            name,
            ttl=TTL,
            scan=SCAN,
            leases=self.backend.leases,
            **kw,  # type: ignore[arg-type]
        )
        self.workers.append(w)
        return w

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        if self.watch is not None:
            self.watch.stop()


@pytest.fixture
def cluster(tmp_path: Path, backend: Backend) -> Iterator[_Cluster]:
    c = _Cluster(tmp_path, backend)
    try:
        yield c
    finally:
        c.close()


def _ran(work: Path, instance_id: str, step: str, node: str) -> Callable[[], bool]:
    return lambda: any(
        e.instance_id == instance_id and e.step == step and e.node == node for e in effects(work)
    )


def test_a_worker_ahead_takes_no_lease_from_a_live_owner(cluster: _Cluster) -> None:
    b, work = cluster.backend, cluster.work
    ids = b.queue(job, 4)
    cluster.watch = watch = b.watch()
    # Three 3 s steps each: every lease is renewed several times while the skewed nodes scan.
    owner = cluster.worker("owner", step_seconds=3.0)
    wait_until(
        lambda: all(_ran(work, i, "a", "owner")() for i in ids),
        30,
        "the owner running every instance",
        workers=[owner],
    )
    ahead = cluster.worker("ahead", skew=SKEW, max_offset=10 * TTL)
    far = cluster.worker("far-ahead", skew=1.5 * TTL, max_offset=10 * TTL)
    ahead.wait_ready()
    far.wait_ready()
    # The skew is real: each measured it against the journal's clock when it started.
    assert ahead.offset() == pytest.approx(SKEW, abs=0.5)
    assert far.offset() == pytest.approx(1.5 * TTL, abs=0.5)
    wait_until(b.all_in(ids, "Completed"), 60, "every instance completed", workers=cluster.workers)

    for i in ids:
        holders = [(h.owner, h.token) for h in watch.holders(i, besides="queue")]
        assert len(holders) == 1 and holders[0][0] == "owner", (i, holders)
        ran = [(e.step, e.node) for e in effects(work) if e.instance_id == i]
        assert ran == [("a", "owner"), ("b", "owner"), ("c", "owner")], (i, ran)
        assert [(n, a) for n, a, _ in b.step_rows(i)] == [
            ("fault.a", 1),
            ("fault.b", 1),
            ("fault.c", 1),
        ]
    for w in (owner, ahead, far):
        assert w.alive(), w.output()
        assert w.lost_lines() == [], w.output()
    figure(
        f"skew_ahead_no_steal[{b.name}]",
        offsets={"ahead": ahead.offset(), "far-ahead": far.offset()},
        takeovers=0,
    )


def test_a_worker_behind_is_not_starved(cluster: _Cluster) -> None:
    b, work = cluster.backend, cluster.work
    [victim] = b.queue(job, 1)
    cluster.watch = watch = b.watch()
    doomed = cluster.worker("doomed", step_seconds=3600)
    wait_until(_ran(work, victim, "a", "doomed"), 30, "doomed running the victim", workers=[doomed])
    behind = cluster.worker("behind", skew=-SKEW, max_offset=10 * TTL, step_seconds=0.2)
    behind.wait_ready()
    assert behind.offset() == pytest.approx(-SKEW, abs=0.5)
    doomed.kill()
    killed = b.now()
    [dead] = watch.holders(victim, besides="queue")
    queued = b.queue(job, 3)
    queued_at = b.now()
    wait_until(b.all_in([victim, *queued], "Completed"), 60, "all four completed", workers=[behind])

    after = watch.holders(victim, besides="queue")
    assert [h.owner for h in after] == ["doomed", "behind"], after
    took = after[1].first_seen
    # Taken when the dead lease ran out on the store's clock, not SKEW later.
    assert _seconds(took, dead.last_expires) <= SCAN + SLACK, (took, dead.last_expires)
    assert _seconds(took, killed) <= TTL + SCAN + SLACK, (took, killed)
    ran = [(e.step, e.node) for e in effects(work) if e.instance_id == victim]
    assert ran == [("a", "doomed"), ("a", "behind"), ("b", "behind"), ("c", "behind")], ran
    waits = []
    for i in queued:
        holders = watch.holders(i, besides="queue")
        assert [h.owner for h in holders] == ["behind"], holders
        waits.append(_seconds(holders[0].first_seen, queued_at))
        assert [(e.step, e.node) for e in effects(work) if e.instance_id == i] == [
            ("a", "behind"),
            ("b", "behind"),
            ("c", "behind"),
        ]
    assert behind.lost_lines() == [], behind.output()
    figure(
        f"skew_behind_not_starved[{b.name}]",
        offset=behind.offset(),
        takeover_after_kill_s=_seconds(took, killed),
        takeover_after_expiry_s=_seconds(took, dead.last_expires),
        queued_taken_after_s=waits,
    )


def test_a_dead_worker_ahead_is_recovered_within_one_ttl(cluster: _Cluster) -> None:
    b, work = cluster.backend, cluster.work
    ahead = cluster.worker("ahead", skew=SKEW, max_offset=10 * TTL, step_seconds=3600)
    # Carries only the child's flow: it cannot take the parent from the queue, so the skewed
    # node does, and creates the child itself.
    rescuer = cluster.worker("rescuer", flows="tests.faults.skew_flows:JOBS", step_seconds=0.2)
    ahead.wait_ready()
    rescuer.wait_ready()
    assert ahead.offset() == pytest.approx(SKEW, abs=0.5)
    [top] = b.queue(parent, 1)
    cluster.watch = watch = b.watch()

    def child_running() -> bool:
        return any(e.step == "a" and e.node == "ahead" for e in effects(work))

    wait_until(child_running, 30, "the skewed node running the child", workers=[ahead])
    ahead.kill()  # at once: the child was created a moment ago, by the skewed node
    killed = b.now()
    [child] = {e.instance_id for e in effects(work) if e.step == "a"}
    wait_until(
        lambda: len(watch.holders(child)) >= 2, 3 * TTL, "the child taken over", workers=[rescuer]
    )
    wait_until(b.all_in([child], "Completed"), 30, "the child completed", workers=[rescuer])
    # The parent, woken by its child's last commit, needs a node that carries it.
    finisher = cluster.worker("finisher")
    wait_until(b.all_in([top], "Completed"), 30, "the parent completed", workers=[finisher])

    dead, took = watch.holders(child)
    assert (dead.owner, took.owner) == ("ahead", "rescuer")
    # The dead node's lease never ran past one TTL on the store's clock ...
    assert _seconds(dead.last_expires, killed) <= TTL + 0.3, (dead.last_expires, killed)
    # ... and its work was taken about one TTL after it died, not TTL + skew.
    assert _seconds(took.first_seen, killed) <= TTL + SCAN + SLACK, (took.first_seen, killed)
    ran = [(e.step, e.node) for e in effects(work) if e.instance_id == child]
    assert ran == [("a", "ahead"), ("a", "rescuer"), ("b", "rescuer"), ("c", "rescuer")], ran
    assert [(e.step, e.node) for e in effects(work) if e.instance_id == top] == [
        ("before", "ahead")
    ]
    figure(
        f"skew_dead_ahead_recovered[{b.name}]",
        offset=SKEW,
        lease_ran_out_after_kill_s=_seconds(dead.last_expires, killed),
        takeover_after_kill_s=_seconds(took.first_seen, killed),
    )


@pytest.mark.parametrize("sign", [1, -1], ids=["ahead", "behind"])
def test_a_worker_two_thirds_of_a_ttl_off_refuses_to_start(
    tmp_path: Path, pg_schema: Callable[[], str], sign: int
) -> None:
    skew = sign * 2 * TTL / 3
    env = {
        **os.environ,
        **skewed_env(skew),
        "FLOWX_LEASE_TTL": f"{TTL:g}s",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    env.pop("FLOWX_MAX_CLOCK_OFFSET", None)
    db = f"{PG_DSN}?flowx_schema={pg_schema()}"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "flowx.cli.main", "worker",
         "--db", db, "--flows", "tests.faults.skew_flows:FLOWS"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    took = time.monotonic() - started
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    said = re.search(r"clock is ([0-9.]+)s (ahead of|behind) ", lines[0])
    assert said, lines[0]
    assert float(said.group(1)) == pytest.approx(abs(skew), abs=0.3), lines[0]
    assert said.group(2) == ("ahead of" if sign > 0 else "behind"), lines[0]
    assert "tolerates 2s" in lines[0], lines[0]  # the limit: TTL/3
    figure(
        f"skew_refused[{'ahead' if sign > 0 else 'behind'}]", seconds_to_exit=took, message=lines[0]
    )
