"""`flowx list` filters, `flowx count`, `flowx result` and `flowx start --wait`, on a real
SQLite file through click's runner; every `-o json` parsed, errors included."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flowx
from tests.cli.cli_flows import greeting
from tests.cli.runner import invoke
from tests.cli.test_cli import FLOWS, ROOT, run_instance, start


def test_list_filters_by_version_tenant_parent_and_creation_time(db: str) -> None:
    first = str(start(db, "--input", '{"name": "a"}')["instance_id"])
    second = str(start(db, "--input", '{"name": "b"}')["instance_id"])
    code, out, _ = invoke("show", second, "--db", db, "-o", "json")
    created = json.loads(out)["instance"]["created_at"]

    def ids(*args: str) -> list[str]:
        code, out, err = invoke("list", "--db", db, "-o", "json", *args)
        assert code == 0, err
        return [r["instance_id"] for r in json.loads(out)["instances"]]

    assert ids("--version", "1.0.0") == [second, first]
    assert ids("--version", "9") == []
    assert ids("--tenant", "nobody") == []
    assert ids("--parent", first) == []
    assert ids("--since", created) == [second]
    assert ids("--until", created) == [first]
    code, out, err = invoke("list", "--db", db, "--since", "last tuesday")
    assert code == 2 and "ISO 8601" in err


def test_count_groups_by_state_or_flow(db: str) -> None:
    done = str(start(db, "--input", '{"name": "d"}')["instance_id"])
    start(db, "--input", '{"name": "p"}')
    asyncio.run(run_instance(db, done))
    code, out, err = invoke("count", "--db", db, "-o", "json")
    assert code == 0, err
    assert json.loads(out) == {
        "by": "state",
        "counts": {"Completed": 1, "Pending": 1},
        "total": 2,
    }
    code, out, _ = invoke("count", "--db", db, "--by", "flow", "--state", "pending", "-o", "json")
    assert json.loads(out) == {"by": "flow", "counts": {"cli.greeting": 1}, "total": 1}
    code, out, err = invoke("count", "--db", db)
    assert code == 0 and out.split()[-4:] == ["Completed", "1", "Pending", "1"]
    assert err.strip() == "2 in all"


def test_result_says_what_an_instance_ended_with_or_that_it_has_not(db: str) -> None:
    iid = str(start(db, "--input", '{"name": "r", "times": 2}')["instance_id"])
    code, out, _ = invoke("result", iid, "--db", db, "-o", "json")
    assert code == 4
    assert json.loads(out)["error"]["code"] == "instance.illegal_state"
    code, out, err = invoke("result", iid, "--db", db, "--wait", "0.2")
    assert code == 4 and "still Pending after 0.2s" in err
    asyncio.run(run_instance(db, iid))
    code, out, err = invoke("result", iid, "--db", db, "-o", "json")
    assert code == 0, err
    assert json.loads(out) == {
        "instance_id": iid,
        "state": "Completed",
        "result": {"text": "hello r hello r"},
        "error": None,
    }
    code, out, _ = invoke("result", iid, "--db", db)
    assert (code, json.loads(out)) == (0, {"text": "hello r hello r"})
    code, _, err = invoke("result", "00000000-0000-4000-8000-000000000000", "--db", db)
    assert code == 3


def test_result_of_an_instance_that_did_not_complete_exits_1(db: str) -> None:
    iid = str(start(db, "--input", '{"name": "t"}')["instance_id"])

    async def terminate() -> None:
        path = db.removeprefix("sqlite:///")
        async with flowx.FlowHost(store=flowx.sqlite(path), flows=[greeting]) as host:
            await host.terminate(iid, "not wanted", by="test")

    asyncio.run(terminate())
    code, out, _ = invoke("result", iid, "--db", db, "-o", "json")
    assert code == 1
    doc = json.loads(out)
    assert (doc["state"], doc["result"], doc["error"]["code"]) == (
        "Terminated",
        None,
        "flow.terminated",
    )


@pytest.mark.timeout(60)
def test_start_wait_prints_what_a_worker_finished(db: str, tmp_path: Path) -> None:
    assert invoke("migrate", "--db", db)[0] == 0
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    worker = subprocess.Popen(
        [
            sys.executable, "-m", "flowx.cli.main", "worker", "--db", db, "--flows", FLOWS,
            "--ready-file", str(ready), "--recovery-scan-interval", "1s",
            "--shutdown-drain-timeout", "5s",
        ],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        code, out, err = invoke(
            "start", "cli.greeting", "--db", db, "--flows", FLOWS,
            "--input", '{"name": "w"}', "--wait", "30", "-o", "json",
        )  # fmt: skip
        assert code == 0, err
        doc = json.loads(out)
        assert (doc["state"], doc["result"]) == ("Completed", {"text": "hello w"})
    finally:
        worker.terminate()
        _, worker_err = worker.communicate(timeout=30)
    assert worker.returncode == 0, worker_err
