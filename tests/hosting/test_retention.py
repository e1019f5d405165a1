"""The retention sweep (R2.13) on memory, SQLite and PostgreSQL: what goes, what stays and
why, the archive that comes first, and one node sweeping at a time.

Instances run on a test clock; the clock is then moved past their windows (Completed 30 d,
every other end 180 d, Suspended never) and the sweep is run by hand.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import flowx
from flowx.stores.protocols import Stores
from flowx.stores.records import ArchivedInstance, InstanceState, RetentionPolicy
from flowx.stores.retention import PARENT_KEPT, UNPUBLISHED
from flowx.testing import FakeClock
from tests.engine import kit
from tests.engine.kit import Ledger, until_state
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse
from tests.postgres_support import PG_DSN
from tests.support.hosts import fold_settings
from tests.support.polling import until

ledger = Ledger("keep")
work = ledger.capability("work")


@flowx.capability("keep.refuse", version="1.0.0")
async def refuse(ctx: flowx.StepContext, order: kit.Order) -> None:
    raise flowx.NonRetryableError("the order was refused")


@flowx.event("keep.happened")
class Happened(BaseModel):
    order_id: str


done_flow = flowx.flow("keep.done", version="1", input=kit.Order).step(work).build()
billing_flow = flowx.flow("keep.billing", version="1", input=kit.Order).step(work).build()
failing_flow = flowx.flow("keep.failing", version="1", input=kit.Order).step(refuse).build()
waiting_flow = (
    flowx.flow("keep.waiting", version="1", input=kit.Order).await_signal("go", dict).build()
)
emitting_flow = (
    flowx.flow("keep.emitting", version="1", input=kit.Order)
    .emit(Happened, lambda o, s: Happened(order_id=o.order_id))
    .build()
)
child_flow = flowx.flow("keep.child", version="1", input=kit.Order).step(work).build()
parent_flow = (
    flowx.flow("keep.parent", version="1", input=kit.Order)
    .sub_flow(child_flow, lambda o, s: o)
    .await_signal("go", dict)
    .build()
)
#: Leaves a row of every kind: a step, an event, a signal.
everything_flow = (
    flowx.flow("keep.everything", version="1", input=kit.Order)
    .step(work)
    .emit(Happened, lambda o, s: Happened(order_id=o.order_id))
    .await_signal("go", dict)
    .build()
)
FLOWS = (
    done_flow,
    billing_flow,
    failing_flow,
    waiting_flow,
    emitting_flow,
    parent_flow,
    everything_flow,
)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store_maker(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: Callable[[], str]
) -> Callable[[], Stores]:
    """A fresh store object per host, all on one database."""
    if request.param == "memory":
        shared = flowx.memory()
        return lambda: shared
    if request.param == "sqlite":
        return lambda: flowx.sqlite(tmp_path / "flowx.db")
    schema = pg_schema()
    return lambda: flowx.postgres(PG_DSN, schema=schema)


@pytest.fixture
async def hosts(
    clock: FakeClock, store_maker: Callable[[], Stores]
) -> AsyncIterator[Callable[..., Any]]:
    made: list[flowx.FlowHost] = []

    async def make(**kw: Any) -> flowx.FlowHost:
        kw.setdefault("store", store_maker())
        kw.setdefault("clock", clock)
        kw.setdefault("recovery", False)
        kw.setdefault("timers", False)
        host = flowx.FlowHost(flows=FLOWS, **fold_settings(kw))
        await host.open()
        made.append(host)
        return host

    yield make
    for host in made:
        await host.drain(timeout=1)


async def _ended(host: flowx.FlowHost, plan: flowx.Plan, order_id: str) -> str:
    handle = await host.start(plan, kit.Order(order_id=order_id))
    await host.wait_idle(timeout=10)
    return handle.instance_id


async def _exists(host: flowx.FlowHost, iid: str) -> bool:
    assert host.store is not None
    return await host.store.journal.get(iid) is not None


class Kept:
    """An archiver that keeps what it is given, or fails while ``broken``."""

    def __init__(self) -> None:
        self.pages: list[Sequence[ArchivedInstance]] = []
        self.broken = False

    async def archive(self, instances: Sequence[ArchivedInstance]) -> None:
        if self.broken:
            raise OSError("the archive bucket refused the write")
        self.pages.append(instances)


async def test_the_sweep_deletes_what_is_past_its_window_and_keeps_the_rest(
    hosts: Any, clock: FakeClock
) -> None:
    kept = Kept()
    host = await hosts(archiver=kept)
    completed = await _ended(host, done_flow, "c1")
    failed = await _ended(host, failing_flow, "f1")
    waiting = await _ended(host, waiting_flow, "w1")
    clock.advance(days=20)
    recent = await _ended(host, done_flow, "c2")
    clock.advance(days=11)  # c1 is 31 days old, c2 11, f1 31 (its window is 180)

    report = await host.sweep_retention()
    assert (report.deleted, report.archived, report.held, report.busy) == (1, 1, 0, False)
    assert not await _exists(host, completed)
    assert [a.instance.instance_id for page in kept.pages for a in page] == [completed]
    [archived] = kept.pages[0]
    assert [s.step_name for s in archived.steps] == ["keep.work"]
    for iid in (failed, waiting, recent):
        assert await _exists(host, iid)
    assert (await host.get(waiting)).state is InstanceState.SUSPENDED

    clock.advance(days=150)  # f1 is 181 days old; w1 waits on, never swept
    again = await host.sweep_retention()
    assert again.deleted == 2  # f1 and c2
    assert not await _exists(host, failed)
    assert await _exists(host, waiting)


async def test_a_flow_s_own_policy_overrides_the_default(hosts: Any, clock: FakeClock) -> None:
    host = await hosts()
    assert host.store is not None
    await host.store.retention.set_policy(
        RetentionPolicy(flow_id="keep.billing", state_class="Completed", retain_for=None)
    )
    await host.store.retention.set_policy(
        RetentionPolicy(flow_id="keep.done", state_class="Completed", retain_for=timedelta(days=1))
    )
    billing = await _ended(host, billing_flow, "b1")
    done = await _ended(host, done_flow, "d1")
    clock.advance(days=2)
    report = await host.sweep_retention()
    assert report.deleted == 1
    assert not await _exists(host, done)
    clock.advance(days=400)
    await host.sweep_retention()
    assert await _exists(host, billing)  # kept for ever


async def test_what_is_still_owed_is_held_back_and_counted(hosts: Any, clock: FakeClock) -> None:
    host = await hosts()
    unpublished = await _ended(host, emitting_flow, "e1")  # no publisher: its event waits
    parent = await _ended(host, parent_flow, "p1")  # its child completed; it waits for "go"
    clock.advance(days=31)
    report = await host.sweep_retention()
    assert report.deleted == 0
    assert report.held_back == {UNPUBLISHED: 1, PARENT_KEPT: 1}
    assert await _exists(host, unpublished)
    assert (await host.get(parent)).state is InstanceState.SUSPENDED


async def test_a_failing_archiver_deletes_nothing(hosts: Any, clock: FakeClock) -> None:
    kept = Kept()
    kept.broken = True
    host = await hosts(archiver=kept)
    first = await _ended(host, done_flow, "a1")
    clock.advance(days=31)
    with pytest.raises(OSError, match="refused the write"):
        await host.sweep_retention()
    assert await _exists(host, first)
    kept.broken = False
    assert (await host.sweep_retention()).deleted == 1


async def test_a_dry_run_counts_and_deletes_nothing(hosts: Any, clock: FakeClock) -> None:
    kept = Kept()
    host = await hosts(archiver=kept)
    ids = [await _ended(host, done_flow, f"d{n}") for n in range(3)]
    clock.advance(days=31)
    report = await host.sweep_retention(dry_run=True)
    assert (report.dry_run, report.deleted, report.archived) == (True, 3, 0)
    assert kept.pages == []
    for iid in ids:
        assert await _exists(host, iid)


async def test_two_nodes_sweeping_at_once_delete_and_archive_each_instance_once(
    hosts: Any, clock: FakeClock
) -> None:
    kept = Kept()
    first = await hosts(archiver=kept, retention_page_size=3)
    second = await hosts(archiver=kept, retention_page_size=3)
    ids = [await _ended(first, done_flow, f"r{n}") for n in range(10)]
    clock.advance(days=31)
    reports = await asyncio.gather(first.sweep_retention(), second.sweep_retention())
    assert sum(r.deleted for r in reports) == 10
    archived = [a.instance.instance_id for page in kept.pages for a in page]
    assert sorted(archived) == sorted(ids)  # each once: the other node was busy or late
    assert [r.busy for r in reports].count(True) <= 1


async def test_an_archived_instance_is_put_back_exactly(tmp_path: Path) -> None:
    """The built-in archiver's file, read back, restores the instance's rows byte for byte
    into a fresh journal."""
    clock = FakeClock()
    archive_dir = tmp_path / "archive"
    settings = flowx.HostSettings.load(
        recovery=False, timers=False, retention_archive_dir=str(archive_dir)
    )
    async with flowx.FlowHost(
        store=flowx.sqlite(tmp_path / "old.db"), flows=FLOWS, settings=settings, clock=clock
    ) as host:
        iid = await _ended(host, everything_flow, "x1")
        await host.signal(iid, "go", {"by": "ann"}, key="k-1")
        await until_state(host, iid, InstanceState.COMPLETED)
        assert host.store is not None
        async with host.store.outbox.claim(limit=10, now=clock.now(), owner="t") as claim:
            claim.published(len(claim.events))
        [before] = await host.store.retention.contents([iid])
        assert (len(before.steps), len(before.signals), len(before.events)) == (3, 1, 1)
        clock.advance(days=31)
        assert (await host.sweep_retention()).deleted == 1
        assert not await _exists(host, iid)
    [path] = list(archive_dir.glob("*.jsonl.gz"))
    [restored] = flowx.read_archive(path)
    assert restored == before

    fresh = tmp_path / "restored.db"
    async with flowx.FlowHost(store=flowx.sqlite(fresh), settings=settings, clock=clock):
        pass  # creates and migrates the journal
    _restore(fresh, restored)
    async with flowx.FlowHost(store=flowx.sqlite(fresh), settings=settings, clock=clock) as host:
        assert host.store is not None
        [again] = await host.store.retention.contents([iid])
        assert again == before
        assert (await until_state(host, iid, InstanceState.COMPLETED)).instance_id == iid


def _restore(path: Path, item: ArchivedInstance) -> None:
    """Insert an archived instance's rows as they were (what an operator's restore does)."""
    from flowx.stores.sqlite.database import to_text

    def row(record: Any) -> dict[str, Any]:
        values = {}
        for name in record.__dataclass_fields__:
            value = getattr(record, name)
            values[name] = (
                to_text(value) if hasattr(value, "tzinfo") else getattr(value, "value", value)
            )
        return values

    conn = sqlite3.connect(path)
    with conn:
        for table, records in (
            ("flow_instance", [item.instance]),
            ("flow_step", list(item.steps)),
            ("flow_signal", list(item.signals)),
            ("outbox_event", list(item.events)),
        ):
            for record in records:
                values = row(record)
                names = ", ".join(values)
                marks = ", ".join(f":{n}" for n in values)
                conn.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", values)
    conn.close()


async def test_a_worker_sweeps_on_its_own_every_interval(hosts: Any, clock: FakeClock) -> None:
    host = await hosts(retention_sweep_interval="1s")
    done = await _ended(host, done_flow, "s1")
    clock.advance(days=31)

    async def swept() -> bool:
        return not await _exists(host, done)

    await until(swept, within=10, what="the scheduled sweep")
