"""`flowx cancel` and `flowx terminate` (R9.4) on a real SQLite file, through click's runner:
every command's `-o json` parsed, its errors and exit codes checked."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import flowx
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceRecord
from tests.cli import wait_flows
from tests.cli.runner import invoke
from tests.cli.wait_flows import FLOWS, Order

FLOWS_REF = "tests.cli.wait_flows:FLOWS"


@pytest.fixture
def db(db: str, faults: Path) -> str:
    return db


def host(db: str) -> flowx.FlowHost:
    return flowx.FlowHost(
        store=flowx.sqlite(db.removeprefix("sqlite:///")),
        flows=FLOWS,
        settings=flowx.HostSettings.load(recovery=False, timers=False),
    )


def at_rest(db: str, plan: flowx.Plan, order_id: str) -> str:
    """Start an instance and run it until it ends or suspends; its id."""

    async def main() -> str:
        async with host(db) as h:
            handle = await h.start(plan, Order(order_id=order_id))
            await h.wait_idle(timeout=10)
            return handle.instance_id

    return asyncio.run(main())


def record_of(db: str, iid: str) -> InstanceRecord:
    async def main() -> InstanceRecord:
        async with host(db) as h:
            return await h.get(iid)

    return asyncio.run(main())


def child_of(db: str, parent: str) -> str:
    async def main() -> str:
        async with host(db) as h:
            assert h.store is not None
            rows = await h.store.catalog.list_instances(InstanceQuery(flow_id="cli.ship"))
            return next(r.instance_id for r in rows if r.parent_instance_id == parent)

    return asyncio.run(main())


def stop(db: str, mode: str, iid: str, *args: str) -> tuple[int, dict[str, object], str]:
    code, out, err = invoke(mode, iid, "--db", db, "-o", "json", *args)
    return code, (json.loads(out) if code == 0 else {}), err


def test_cancel_with_flows_stops_a_waiting_parent_and_its_child_here(db: str) -> None:
    parent = at_rest(db, wait_flows.parcel, "p1")
    child = child_of(db, parent)
    code, doc, err = stop(
        db, "cancel", parent, "--reason", "order withdrawn", "--by", "ann", "--flows", FLOWS_REF
    )
    assert code == 0, err
    assert doc == {
        "instance_id": parent,
        "mode": "cancel",
        "status": "requested",
        "state": "Cancelled",
        "reached": [parent, child],
        "waiting": [],
    }
    assert record_of(db, child).state.value == "Cancelled"
    code, out, _ = invoke("show", child, "--db", db, "-o", "json")
    assert code == 0
    shown = json.loads(out)["instance"]
    assert shown["stop_request"]["by"] == "ann"
    assert (shown["error"]["code"], shown["error"]["reason"]) == (
        "flow.cancelled",
        "order withdrawn",
    )
    code, out, _ = invoke("show", child, "--db", db)
    assert "cancel by ann at " in out and "order withdrawn" in out

    again, doc, _ = stop(db, "cancel", parent, "--reason", "again")
    assert (again, doc["status"], doc["state"]) == (0, "ended", "Cancelled")
    code, out, _ = invoke("cancel", parent, "--db", db, "--reason", "again")
    assert (code, out.strip()) == (
        0,
        f"instance {parent} had already ended Cancelled; nothing to do",
    )


def test_cancel_without_flows_leaves_an_instance_owing_a_compensation_to_a_worker(
    db: str, faults: Path
) -> None:
    iid = at_rest(db, wait_flows.shipping, "s1")  # reserved, then waits for `shipped`
    code, doc, err = stop(db, "cancel", iid, "--reason", "customer left")
    assert code == 0, err
    assert (doc["state"], doc["waiting"]) == ("Pending", [iid])
    code, out, _ = invoke("cancel", iid, "--db", db, "--reason", "customer left")
    assert code == 0
    assert "left Pending for a worker that carries their flow" in out

    async def worker() -> None:
        async with host(db) as h:
            await h.recover_once()
            await h.wait_idle(timeout=10)

    asyncio.run(worker())
    record = record_of(db, iid)
    assert record.state.value == "Cancelled"
    assert wait_flows.calls("notify") == 0


def test_terminate_without_flows_ends_a_waiting_instance(db: str) -> None:
    iid = at_rest(db, wait_flows.shipping, "s2")
    code, doc, err = stop(db, "terminate", iid, "--reason", "abandoned", "--by", "ops")
    assert code == 0, err
    assert (doc["status"], doc["state"], doc["waiting"]) == ("requested", "Terminated", [])
    error = json.loads(record_of(db, iid).error or "null")
    assert (error["code"], error["by"]) == ("flow.terminated", "ops")


def test_errors_have_their_exit_codes_and_no_traceback(db: str) -> None:
    done = at_rest(db, wait_flows.mail, "m1")
    assert record_of(db, done).state.value == "Completed"
    code, _, err = invoke("cancel", done, "--db", db, "--reason", "late")
    assert code == 4
    assert "already ended (Completed); there is nothing to cancel" in err
    code, _, err = invoke(
        "terminate", "00000000-0000-4000-8000-000000000000", "--db", db, "--reason", "x"
    )
    assert code == 3
    code, _, err = invoke("cancel", done, "--db", db)
    assert code == 2 and "--reason" in err
    code, _, err = invoke("cancel", done, "--db", db, "--reason", "   ")
    assert code == 2 and "needs a reason" in err
    for text in (err,):
        assert "Traceback" not in text
    assert record_of(db, done).state.value == "Completed"
