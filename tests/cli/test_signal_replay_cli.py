"""`flowx signal`, `flowx replay` and what `flowx show` says of a waiting instance, on a real
SQLite file, through click's runner. Faults are marker files (see ``wait_flows``), so a test
breaks a capability, lets an instance fail, deletes the file and replays."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import flowx
from flowx.plan.model import Plan
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceRecord, InstanceState, Outcome, StepRecord
from tests.cli import wait_flows
from tests.cli.runner import invoke
from tests.cli.wait_flows import FLOWS, Order, OrderState, Shipment

FLOWS_REF = "tests.cli.wait_flows:FLOWS"
ROOT = Path(__file__).resolve().parents[2]
SHIPPED = '{"carrier": "dhl", "tracking": "T1"}'


@pytest.fixture
def db(db: str, faults: Path) -> str:
    """The shared journal, with this file's fault switches (``faults``) set for every test."""
    return db


def flowx_(db: str, command: str, *args: str) -> tuple[int, str, str]:
    """Run ``flowx COMMAND ARGS --db DB --flows wait_flows:FLOWS``."""
    return invoke(command, *args, "--db", db, "--flows", FLOWS_REF)


def host(db: str) -> flowx.FlowHost:
    path = db.removeprefix("sqlite:///")
    return flowx.FlowHost(
        store=flowx.sqlite(path),
        flows=FLOWS,
        settings=flowx.HostSettings.load(recovery=False, timers=False),
    )


def run_until_rest(db: str, plan: Plan, order_id: str) -> str:
    """Start an instance here and run it until it ends or suspends; return its id."""

    async def main() -> str:
        async with host(db) as h:
            handle = await h.start(plan, Order(order_id=order_id))
            await h.wait_idle(timeout=10)
            return handle.instance_id

    return asyncio.run(main())


def work(db: str) -> None:
    """What a worker does: one recovery sweep, then run what it took to rest."""

    async def main() -> None:
        async with host(db) as h:
            await h.recover_once()
            await h.wait_idle(timeout=10)

    asyncio.run(main())


def record_of(db: str, iid: str) -> InstanceRecord:
    async def main() -> InstanceRecord:
        async with host(db) as h:
            return await h.get(iid)

    return asyncio.run(main())


def rows_of(db: str, iid: str) -> list[StepRecord]:
    async def main() -> list[StepRecord]:
        async with host(db) as h:
            assert h.store is not None
            return list(await h.store.journal.steps(iid))

    return asyncio.run(main())


def inbox_of(db: str, iid: str) -> list[Any]:
    async def main() -> list[Any]:
        async with host(db) as h:
            assert h.store is not None
            return list(await h.store.waits.signals(iid, "shipped"))

    return asyncio.run(main())


def suspended(db: str) -> str:
    iid = run_until_rest(db, wait_flows.shipping, "s1")
    assert record_of(db, iid).state is InstanceState.SUSPENDED
    return iid


def compensation_failed(db: str, faults: Path) -> str:
    (faults / "capture").touch()
    (faults / "release").touch()
    iid = run_until_rest(db, wait_flows.saga, "c1")
    assert record_of(db, iid).state is InstanceState.COMPENSATION_FAILED
    return iid


# -- flowx signal ----------------------------------------------------------------------------


def test_a_signal_wakes_the_instance_and_leaves_it_for_a_worker(db: str) -> None:
    iid = suspended(db)
    code, out, err = flowx_(db, "signal", iid, "shipped", "--payload", SHIPPED, "--key", "h-1")
    assert code == 0, err
    assert out.startswith(f"woken: signal 'shipped' #1 for {iid} (state Pending)")
    # Not run by the command: handed back Pending, the signal in the inbox, nothing notified.
    assert record_of(db, iid).state is InstanceState.PENDING
    assert [(s.key, json.loads(s.payload)) for s in inbox_of(db, iid)] == [
        ("h-1", {"carrier": "dhl", "tracking": "T1"})
    ]
    assert wait_flows.calls("notify") == 0
    work(db)
    done = record_of(db, iid)
    assert done.state is InstanceState.COMPLETED
    state = OrderState.model_validate_json(done.state_bag)
    assert state.shipment == Shipment(carrier="dhl", tracking="T1")
    assert state.note == "sent" and wait_flows.calls("notify") == 1


def test_the_flowx_process_hands_the_woken_instance_back_when_it_exits(db: str) -> None:
    iid = suspended(db)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    proc = subprocess.run(
        [
            sys.executable, "-m", "flowx.cli.main", "signal", iid, "shipped",
            "--payload", SHIPPED, "--db", db, "--flows", FLOWS_REF, "-o", "json",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "woken"
    record = record_of(db, iid)
    assert record.state is InstanceState.PENDING  # not lost, not run: a worker's to take

    async def lease_free() -> bool:
        async with host(db) as h:
            assert h.store is not None
            lease = await h.store.leases.current(iid)
            return lease is None or lease.expires_at <= h.clock.now()

    assert asyncio.run(lease_free())
    work(db)
    assert record_of(db, iid).state is InstanceState.COMPLETED


def test_a_repeated_key_is_a_duplicate_and_exits_0(db: str) -> None:
    iid = suspended(db)
    first = flowx_(db, "signal", iid, "shipped", "--payload", SHIPPED, "--key", "k", "-o", "json")
    again = flowx_(db, "signal", iid, "shipped", "--payload", SHIPPED, "--key", "k", "-o", "json")
    assert (first[0], again[0]) == (0, 0), first[2] + again[2]
    one, two = json.loads(first[1]), json.loads(again[1])
    assert (one["status"], two["status"]) == ("woken", "duplicate")
    assert two == {**one, "status": "duplicate", "state": "Pending"}
    assert one["instance_id"] == iid and one["name"] == "shipped" and one["seq"] == 1
    assert len(inbox_of(db, iid)) == 1
    code, out, _ = flowx_(db, "signal", iid, "shipped", "--payload", SHIPPED, "--key", "k")
    assert code == 0 and out.startswith("duplicate: signal 'shipped' #1")


def test_a_signal_to_no_instance_exits_3(db: str) -> None:
    suspended(db)  # a journal with something in it
    code, out, err = flowx_(db, "signal", "5b0c1d7e-0000-4000-8000-000000000000", "shipped")
    assert code == 3
    assert out == "" and "no flow instance '5b0c1d7e-0000-4000-8000-000000000000'" in err
    assert "Traceback" not in err


def test_a_signal_to_an_instance_that_has_ended_exits_4(db: str) -> None:
    iid = suspended(db)
    assert flowx_(db, "signal", iid, "shipped", "--payload", SHIPPED)[0] == 0
    work(db)
    assert record_of(db, iid).state is InstanceState.COMPLETED
    code, _, err = flowx_(db, "signal", iid, "shipped", "--payload", SHIPPED)
    assert code == 4
    assert "already ended (Completed)" in err and "Traceback" not in err
    assert len(inbox_of(db, iid)) == 1  # nothing kept


def test_a_retried_delivery_to_an_instance_that_has_ended_is_a_duplicate_and_exits_0(
    db: str,
) -> None:
    """R2.10: a webhook sender that retries on error gets a success; a new key still exits 4."""
    iid = suspended(db)
    first = flowx_(db, "signal", iid, "shipped", "--payload", SHIPPED, "--key", "hook-1")
    assert first[0] == 0, first[2]
    work(db)
    assert record_of(db, iid).state is InstanceState.COMPLETED
    code, out, err = flowx_(
        db, "signal", iid, "shipped", "--payload", SHIPPED, "--key", "hook-1", "-o", "json"
    )
    assert code == 0, err
    assert json.loads(out) == {
        "instance_id": iid,
        "name": "shipped",
        "seq": 1,
        "status": "duplicate",
        "state": "Completed",
    }
    code, _, err = flowx_(db, "signal", iid, "shipped", "--payload", SHIPPED, "--key", "hook-2")
    assert code == 4 and "already ended (Completed)" in err
    assert len(inbox_of(db, iid)) == 1


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ('{"carrier": "dhl"}', "field 'tracking'"),  # the wrong shape
        ('{"carrier": "dhl",', "not valid JSON"),  # not JSON at all
        ("{}", "field 'carrier'"),  # the default payload
    ],
)
def test_a_bad_payload_is_a_usage_error_that_keeps_nothing(
    db: str, payload: str, says: str
) -> None:
    iid = suspended(db)
    args = ("--payload", payload) if payload != "{}" else ()
    code, out, err = flowx_(db, "signal", iid, "shipped", *args)
    assert code == 2
    assert out == ""
    assert says in err and "--payload" in err and "Traceback" not in err
    assert inbox_of(db, iid) == []
    assert record_of(db, iid).state is InstanceState.SUSPENDED


def test_an_unknown_signal_name_is_a_usage_error_naming_the_known_ones(db: str) -> None:
    iid = suspended(db)
    code, _, err = flowx_(db, "signal", iid, "delivered", "--payload", SHIPPED)
    assert code == 2
    assert "'delivered'" in err and "waits for: shipped" in err
    assert inbox_of(db, iid) == []
    assert record_of(db, iid).state is InstanceState.SUSPENDED


def test_a_flow_not_among_flows_says_to_pass_its_module(db: str) -> None:
    iid = suspended(db)
    code, _, err = invoke(
        "signal",
        iid,
        "shipped",
        "--payload",
        SHIPPED,
        "--db",
        db,
        "--flows",
        "tests.cli.wait_flows:WITHOUT_SHIPPING",
    )
    assert code == 2
    assert "'cli.ship@1.0.0'" in err and "pass the module that defines it" in err
    assert record_of(db, iid).state is InstanceState.SUSPENDED


# -- flowx replay ----------------------------------------------------------------------------


def test_a_dry_run_says_what_would_rerun_and_writes_nothing(db: str, faults: Path) -> None:
    iid = compensation_failed(db, faults)
    before_rows, before = rows_of(db, iid), record_of(db, iid)
    releases = wait_flows.calls("release")
    code, out, err = flowx_(db, "replay", "--instance", iid, "--from", "cli.reserve", "--dry-run")
    assert code == 0, err
    assert out.splitlines() == [
        f"would replay {iid} (CompensationFailed) in compensation mode from 'cli.reserve' "
        "(step #1)",
        "re-runs:",
        "  undo cli.reserve",
        "dry run: nothing was written",
    ]
    code, out, err = flowx_(
        db, "replay", "--instance", iid, "--from", "cli.reserve", "--dry-run", "-o", "json"
    )
    assert code == 0, err
    assert json.loads(out) == {
        "instance_id": iid,
        "state": "CompensationFailed",
        "mode": "compensation",
        "step": "cli.reserve",
        "step_id": 1,
        "scope": "",
        "reruns": ["undo cli.reserve"],
        "undo": [],
        "kept": [],
        "deadline_at": None,
        "dry_run": True,
        "final_state": None,
        "error": None,
    }
    assert rows_of(db, iid) == before_rows
    assert record_of(db, iid) == before
    assert wait_flows.calls("release") == releases


def test_a_replay_after_the_fix_ends_failed_with_new_rows_only(db: str, faults: Path) -> None:
    iid = compensation_failed(db, faults)
    before = rows_of(db, iid)
    (faults / "release").unlink()  # the fault is fixed
    code, out, err = flowx_(db, "replay", "--instance", iid, "--from", "cli.reserve")
    assert code == 0, err
    assert out.splitlines()[-1] == "final state: Failed"
    assert "in compensation mode from 'cli.reserve'" in out
    record = record_of(db, iid)
    assert record.state is InstanceState.FAILED and record.resume_from_step == 1
    after = rows_of(db, iid)
    assert after[: len(before)] == before  # history kept, unchanged
    new = [(r.step_name, r.attempt, r.outcome) for r in after[len(before) :]]
    assert new == [("cli.reserve", 4, Outcome.COMPENSATED)]
    assert wait_flows.calls("capture") == 1  # nothing forward re-ran


def test_a_replay_that_fails_again_exits_1_with_the_error(db: str, faults: Path) -> None:
    iid = compensation_failed(db, faults)
    before = rows_of(db, iid)
    code, out, err = flowx_(db, "replay", "--instance", iid, "--from", "cli.reserve")
    assert code == 1
    assert out.splitlines()[-1] == "final state: CompensationFailed"
    assert "ended CompensationFailed again" in err and "refused the release" in err
    after = rows_of(db, iid)
    assert after[: len(before)] == before
    assert [(r.attempt, r.outcome) for r in after[len(before) :]] == [
        (4, Outcome.COMPENSATION_FAILURE),
        (5, Outcome.COMPENSATION_FAILURE),
    ]


def test_a_replay_from_the_wrong_step_exits_4_naming_the_right_one(db: str, faults: Path) -> None:
    iid = compensation_failed(db, faults)
    before = rows_of(db, iid)
    code, out, err = flowx_(db, "replay", "--instance", iid, "--from", "cli.capture")
    assert code == 4
    assert out == "" and "--from 'cli.reserve'" in err
    assert rows_of(db, iid) == before
    assert record_of(db, iid).state is InstanceState.COMPENSATION_FAILED


def test_replay_refuses_an_instance_that_is_not_stopped_and_one_that_does_not_exist(
    db: str,
) -> None:
    iid = suspended(db)
    code, _, err = flowx_(db, "replay", "--instance", iid, "--from", "cli.reserve")
    assert code == 4 and "is Suspended" in err
    code, _, err = flowx_(
        db, "replay", "--instance", "5b0c1d7e-0000-4000-8000-000000000000", "--from", "x"
    )
    assert code == 3 and "no flow instance" in err


def test_a_forward_replay_with_no_wait_is_left_for_a_worker(db: str, faults: Path) -> None:
    (faults / "notify").touch()
    iid = run_until_rest(db, wait_flows.mail, "m1")
    assert record_of(db, iid).state is InstanceState.FAILED
    (faults / "notify").unlink()
    code, out, err = flowx_(db, "replay", "--instance", iid, "--from", "cli.notify", "--no-wait")
    assert code == 0, err
    assert "in forward mode from 'cli.notify'" in out
    assert out.splitlines()[-1] == "left Pending for a worker (--no-wait)"
    assert record_of(db, iid).state is InstanceState.PENDING
    assert wait_flows.calls("notify") == 1  # only the first, failed, try
    work(db)
    done = record_of(db, iid)
    assert done.state is InstanceState.COMPLETED
    assert OrderState.model_validate_json(done.state_bag).note == "sent"
    assert [(r.step_name, r.attempt, r.outcome) for r in rows_of(db, iid)] == [
        ("cli.reserve", 1, Outcome.SUCCESS),
        ("cli.notify", 1, Outcome.FAILURE),
        ("cli.notify", 2, Outcome.SUCCESS),
    ]


def test_a_forward_replay_that_fails_again_exits_1(db: str, faults: Path) -> None:
    (faults / "notify").touch()
    iid = run_until_rest(db, wait_flows.mail, "m2")
    code, out, err = flowx_(db, "replay", "--instance", iid, "--from", "2", "-o", "json")
    assert code == 1
    data = json.loads(out)
    assert (data["mode"], data["final_state"]) == ("forward", "Failed")
    assert data["error"]["message"] == "mail relay down"
    assert "ended Failed again" in err
    assert [r.attempt for r in rows_of(db, iid) if r.step_name == "cli.notify"] == [1, 2]


def test_a_cancelled_instance_replays_forward_from_a_chosen_step(db: str) -> None:
    """``flowx replay --from`` on a Cancelled instance: the step before the chosen one keeps
    its result, the rest re-run, and the instance waits again for its signal."""
    iid = suspended(db)
    assert flowx_(db, "cancel", iid, "--reason", "customer asked")[0] == 0
    assert record_of(db, iid).state is InstanceState.CANCELLED
    code, out, err = flowx_(db, "replay", "--instance", iid, "--from", "cli.notify")
    assert code == 4 and out == ""
    assert "before it is where the instance stopped" in err and "replay --from" in err
    reserves = wait_flows.calls("reserve")
    code, out, err = flowx_(db, "replay", "--instance", iid, "--from", "2", "-o", "json")
    assert code == 0, err
    data = json.loads(out)
    assert (data["mode"], data["state"], data["final_state"]) == (
        "forward",
        "Cancelled",
        "Suspended",
    )
    assert (data["kept"], data["undo"]) == (["cli.reserve"], [])
    assert data["reruns"][-1] == "cli.notify" and len(data["reruns"]) == 2
    assert wait_flows.calls("reserve") == reserves  # kept, not re-run
    record = record_of(db, iid)
    assert (record.state, record.stop_request, record.replay_from) == (
        InstanceState.SUSPENDED,
        None,
        2,
    )


def test_a_bad_deadline_is_a_usage_error_and_a_deadline_is_refused_where_it_means_nothing(
    db: str, faults: Path
) -> None:
    iid = compensation_failed(db, faults)
    code, out, err = flowx_(
        db,
        "replay",
        "--instance",
        iid,
        "--from",
        "cli.reserve",
        "--deadline",
        "soon",
        "-o",
        "json",
    )
    assert code == 2 and "--deadline" in err and "1h30m" in err
    assert json.loads(out)["error"]["exit"] == 2
    code, _, err = flowx_(
        db, "replay", "--instance", iid, "--from", "cli.reserve", "--deadline", "1h"
    )
    assert code == 4 and "a new deadline is for replaying" in err
    assert record_of(db, iid).state is InstanceState.COMPENSATION_FAILED


# -- flowx show ------------------------------------------------------------------------------


def _facts(out: str) -> dict[str, str]:
    head = out.split("\n\n", 1)[0]
    return {k: v.strip() for k, _, v in (line.partition("  ") for line in head.splitlines())}


def test_show_says_what_a_suspended_instance_waits_for(db: str) -> None:
    iid = suspended(db)
    record = record_of(db, iid)
    assert record.wake_at is not None
    code, out, err = invoke("show", iid, "--db", db)
    assert code == 0, err
    facts = _facts(out)
    assert facts["waits for"].startswith("signal 'shipped'")
    assert facts["wake at"] == record.wake_at.isoformat()
    assert facts["wait step"] == "#2, scope -"
    code, out, _ = invoke("show", iid, "--db", db, "--flows", FLOWS_REF)
    assert code == 0
    assert _facts(out)["wait step"] == "'shipped' (#2), scope -"
    code, out, _ = invoke("show", iid, "--db", db, "-o", "json")
    data = json.loads(out)
    assert {"instance", "steps", "waiting", "parent"} <= set(data)
    assert data["instance"]["wake_signal"] == "shipped"
    assert data["waiting"] == {
        "kind": "signal",
        "signal": "shipped",
        "wake_at": record.wake_at.isoformat(),
        "step_id": 2,
        "step": None,
        "scope": "",
    }
    assert data["parent"] is None
    # Once woken it waits for nothing, and show says nothing of a wait.
    assert flowx_(db, "signal", iid, "shipped", "--payload", SHIPPED)[0] == 0
    code, out, _ = invoke("show", iid, "--db", db)
    assert "waits for" not in _facts(out) and _facts(out)["state"] == "Pending"
    assert json.loads(invoke("show", iid, "--db", db, "-o", "json")[1])["waiting"] is None


def test_show_names_a_childs_parent_and_a_parents_child_wait(db: str) -> None:
    parent = run_until_rest(db, wait_flows.parcel, "p1")

    async def child_of() -> str:
        async with host(db) as h:
            assert h.store is not None
            rows = await h.store.catalog.list_instances(InstanceQuery(flow_id="cli.ship"))
            return next(r.instance_id for r in rows if r.parent_instance_id == parent)

    child = asyncio.run(child_of())
    code, out, err = invoke("show", parent, "--db", db, "--flows", FLOWS_REF)
    assert code == 0, err
    facts = _facts(out)
    assert facts["state"] == "Suspended"
    assert facts["waits for"].startswith("sub-flow child")
    assert facts["wait step"] == "'ship it' (#1), scope -"
    waiting = json.loads(invoke("show", parent, "--db", db, "-o", "json")[1])["waiting"]
    assert (waiting["kind"], waiting["signal"], waiting["step_id"]) == ("sub_flow", None, 1)
    code, out, _ = invoke("show", child, "--db", db)
    assert code == 0
    assert _facts(out)["parent"] == f"{parent} (step 1, scope -)"
    assert _facts(out)["waits for"].startswith("signal 'shipped'")
    data = json.loads(invoke("show", child, "--db", db, "-o", "json")[1])
    assert data["parent"] == {"instance_id": parent, "scope": "", "step_id": 1}
    assert data["instance"]["parent_instance_id"] == parent


def test_show_lists_the_inbox_with_what_was_taken_and_the_staged_events(db: str) -> None:
    iid = suspended(db)
    code, _, err = flowx_(db, "signal", iid, "shipped", "--payload", SHIPPED, "--key", "k1")
    assert code == 0, err
    code, _, err = flowx_(db, "signal", iid, "late-note", "--payload", "{}")
    assert code == 2  # the flow never waits for it: refused, not kept
    work(db)  # takes the signal, notifies, completes
    code, out, _ = invoke("show", iid, "--db", db, "-o", "json")
    assert code == 0
    doc = json.loads(out)
    assert [(s["name"], s["key"], s["taken"]) for s in doc["signals"]] == [("shipped", "k1", True)]
    assert doc["signals"][0]["payload"] == json.loads(SHIPPED)
    assert doc["events"] == []  # the shipping flow emits nothing
    code, out, _ = invoke("show", iid, "--db", db)
    assert code == 0
    signals = out.split("\nsignals\n", 1)[1].splitlines()
    assert signals[0].split() == ["seq", "name", "key", "received_at", "taken"]
    assert signals[2].split()[1:3] == ["shipped", "k1"] and signals[2].split()[-1] == "True"
