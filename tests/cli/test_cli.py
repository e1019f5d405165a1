"""The `flowx` command, run in-process through click's runner on a real SQLite file."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import flowx
from tests.cli.cli_flows import greeting
from tests.cli.runner import invoke

FLOWS = "tests.cli.cli_flows:FLOWS"
ROOT = Path(__file__).resolve().parents[2]


def start(db: str, *extra: str) -> dict[str, object]:
    code, out, err = invoke(
        "start", "cli.greeting", "--db", db, "--flows", FLOWS, "-o", "json", *extra
    )
    assert code == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


async def run_instance(db: str, instance_id: str) -> None:
    path = db.removeprefix("sqlite:///")
    async with flowx.FlowHost(
        store=flowx.sqlite(path),
        flows=[greeting],
        settings=flowx.HostSettings.load(recovery=False),
    ) as host:
        assert await host.resume(instance_id) == "resumed"
        await host.wait_idle()


def test_start_leaves_a_pending_instance_for_a_worker(db: str) -> None:
    started = start(db, "--input", '{"name": "ada"}')
    assert started["created"] is True
    code, out, _ = invoke("list", "--db", db, "-o", "json")
    assert code == 0
    rows = json.loads(out)["instances"]
    assert [(r["instance_id"], r["state"], r["input"]) for r in rows] == [
        (started["instance_id"], "Pending", {"name": "ada", "times": 1})
    ]


def test_a_repeated_idempotency_key_returns_the_same_instance(db: str) -> None:
    first = start(db, "--input", '{"name": "bo"}', "--idempotency-key", "k-1")
    again = start(db, "--input", '{"name": "bo"}', "--idempotency-key", "k-1")
    assert again == {"instance_id": first["instance_id"], "created": False}


def test_bad_input_exits_1_naming_the_field(db: str) -> None:
    code, _, err = invoke(
        "start",
        "cli.greeting",
        "--db",
        db,
        "--flows",
        FLOWS,
        "--input",
        '{"name": "x", "times": "many"}',
    )
    assert code == 1
    assert "field 'times'" in err
    assert "Traceback" not in err


def test_a_repeated_key_in_text_mode_prints_only_the_id_on_stdout(db: str) -> None:
    args = ("--input", '{"name": "eve"}', "--idempotency-key", "k-text")
    first = start(db, *args)
    code, out, err = invoke("start", "cli.greeting", "--db", db, "--flows", FLOWS, *args)
    assert code == 0
    assert out.strip() == first["instance_id"]
    assert "already started" in err


def test_reusing_a_key_for_another_input_exits_1(db: str) -> None:
    start(db, "--input", '{"name": "fay"}', "--idempotency-key", "k-2")
    code, _, err = invoke(
        "start", "cli.greeting", "--db", db, "--flows", FLOWS,
        "--input", '{"name": "gil"}', "--idempotency-key", "k-2",
    )  # fmt: skip
    assert code == 1
    assert err.startswith("error: idempotency key 'k-2' already started instance")


def test_input_can_come_from_a_file(db: str, tmp_path: Path) -> None:
    path = tmp_path / "input.json"
    path.write_text('{"name": "hal", "times": 3}')
    started = start(db, "--input-file", str(path))
    code, out, _ = invoke("show", str(started["instance_id"]), "--db", db, "--json")
    assert code == 0
    assert json.loads(out)["instance"]["input"] == {"name": "hal", "times": 3}
    code, _, err = invoke(
        "start", "cli.greeting", "--db", db, "--flows", FLOWS,
        "--input", "{}", "--input-file", str(path),
    )  # fmt: skip
    assert code == 2
    assert "not both" in err


def test_an_ephemeral_flow_is_refused_rather_than_run_and_forgotten(db: str) -> None:
    code, _, err = invoke(
        "start", "cli.scratch", "--db", db,
        "--flows", "tests.cli.cli_flows:FLOWS_WITH_EPHEMERAL", "--input", '{"name": "x"}',
    )  # fmt: skip
    assert code == 1
    assert "Ephemeral" in err
    code, out, err = invoke("list", "--db", db, "-o", "json")
    assert code == 3  # nothing was started: not even the journal was created
    assert json.loads(out)["error"]["code"] == "store.journal_not_found"
    assert "no journal at" in err


def test_an_unimportable_flows_module_is_explained(db: str) -> None:
    code, _, err = invoke("start", "cli.greeting", "--db", db, "--flows", "no.such.module:FLOWS")
    assert code == 2  # a usage error
    assert "cannot import 'no.such.module'" in err
    assert "Traceback" not in err


def test_an_unknown_flow_exits_3(db: str) -> None:
    code, _, err = invoke("start", "cli.nope", "--db", db, "--flows", FLOWS)
    assert code == 3
    assert "cli.nope" in err and "cli.greeting@1.0.0" in err


def test_show_of_a_pending_instance_says_no_steps_yet(db: str) -> None:
    instance_id = str(start(db, "--input", '{"name": "zed"}')["instance_id"])
    code, out, _ = invoke("show", instance_id, "--db", db)
    assert code == 0
    assert f"instance   {instance_id}" in out
    assert "flow       cli.greeting@1.0.0" in out
    assert "state      Pending" in out
    assert out.rstrip().endswith("no steps committed yet")


def test_show_prints_the_instance_and_its_steps(db: str) -> None:
    instance_id = str(start(db, "--input", '{"name": "cy", "times": 2}')["instance_id"])
    asyncio.run(run_instance(db, instance_id))
    code, out, _ = invoke("show", instance_id, "--db", db)
    assert code == 0
    assert "Completed" in out
    assert "cli.test.greet@1.0.0" in out
    assert "hello cy hello cy" in out
    code, out, _ = invoke("show", instance_id, "--db", db, "-o", "json")
    shown = json.loads(out)
    assert shown["instance"]["state"] == "Completed"
    assert [(s["step_name"], s["outcome"], s["result"]) for s in shown["steps"]] == [
        ("cli.test.greet", "Success", "hello cy hello cy")
    ]


def test_list_text_is_a_table_with_a_next_page_cursor(db: str) -> None:
    ids = [start(db, "--input", f'{{"name": "n{i}"}}')["instance_id"] for i in range(3)]
    code, out, err = invoke("list", "--db", db, "--limit", "2")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["instance", "flow", "version", "state", "created", "updated"]
    page_one = [line.split()[0] for line in lines[2:]]
    assert page_one == ids[:0:-1]  # newest first
    # The hint goes to stderr, so `flowx list | ...` sees only the table.
    assert err.startswith("more: --before ")
    cursor = err.strip().removeprefix("more: --before ")
    code, out, err = invoke("list", "--db", db, "--before", cursor, "-o", "json")
    assert code == 0
    assert json.loads(out) == {"instances": json.loads(out)["instances"], "next": None}
    assert [r["instance_id"] for r in json.loads(out)["instances"]] == [ids[0]]
    assert err == ""  # a short page prints no cursor
    code, out, _ = invoke("list", "--db", db, "--limit", "2", "-o", "json")
    assert json.loads(out)["next"] == cursor  # the same cursor the text hint gave


def test_list_filters_by_state_case_insensitively(db: str) -> None:
    pending = str(start(db, "--input", '{"name": "p"}')["instance_id"])
    done = str(start(db, "--input", '{"name": "d"}')["instance_id"])
    asyncio.run(run_instance(db, done))
    code, out, _ = invoke("list", "--db", db, "--state", "completed", "-o", "json")
    assert code == 0
    assert [r["instance_id"] for r in json.loads(out)["instances"]] == [done]
    code, out, _ = invoke("list", "--db", db, "--state", "Pending", "--flow", "cli.greeting")
    assert code == 0
    assert pending in out and done not in out
    code, out, _ = invoke("list", "--db", db, "--flow", "cli.other")
    assert (code, out.strip()) == (0, "no instances")


def test_a_malformed_cursor_is_a_usage_error(db: str) -> None:
    code, _, err = invoke("list", "--db", db, "--before", "yesterday")
    assert code == 2
    assert "CREATED_AT,ID" in err


def test_show_of_an_unknown_instance_exits_3(db: str) -> None:
    assert invoke("migrate", "--db", db)[0] == 0
    code, out, err = invoke("show", "00000000-0000-0000-0000-000000000000", "--db", db)
    assert code == 3
    assert "no flow instance" in err
    code, out, _ = invoke("show", "00000000-0000-0000-0000-000000000000", "--db", db, "-o", "json")
    assert code == 3
    assert json.loads(out)["error"] == {
        "code": "instance.not_found",
        "exit": 3,
        "message": "no flow instance '00000000-0000-0000-0000-000000000000' in this journal",
    }


def test_a_read_command_never_creates_a_journal(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    for command in (("list",), ("count",), ("show", "x"), ("result", "x"), ("retention", "show")):
        code, _, err = invoke(*command, "--db", f"sqlite:///{path}")
        assert code == 3, command
        assert f"no journal at {path}" in err
        assert not path.exists()


def test_a_read_command_never_creates_a_postgresql_schema(
    pg_schema: Callable[[], str],
) -> None:
    """The same on PostgreSQL: a schema that does not exist is not found (exit 3) and is
    still not there after the command."""
    import psycopg

    from tests.postgres_support import PG_DSN

    schema = pg_schema()  # a fresh name, dropped after the test if anything made it
    url = f"{PG_DSN}{'&' if '?' in PG_DSN else '?'}flowx_schema={schema}"
    for command in (("list",), ("count",), ("show", "x"), ("retention", "show")):
        code, out, err = invoke(*command, "--db", url, "-o", "json")
        assert code == 3, (command, err)
        assert json.loads(out)["error"]["code"] == "store.journal_not_found"
        assert f"no FlowX journal in schema {schema!r}" in err
    with psycopg.connect(PG_DSN) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)
        ).fetchone()
    assert found == (0,)


def test_migrate_reports_the_schema_version(db: str) -> None:
    code, out, _ = invoke("migrate", "--db", db, "-o", "json")
    assert code == 0
    migrated = json.loads(out)
    assert migrated["store"] == db
    assert migrated["schema_version"] >= 1
    # Migrating again is a no-op that says so.
    code, out, _ = invoke("migrate", "--db", db)
    assert code == 0
    assert out.strip() == f"{db}: schema up to date (version {migrated['schema_version']})"


def test_migrate_refuses_a_file_that_is_not_a_journal(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database at all\n" * 50)
    code, _, err = invoke("migrate", "--db", f"sqlite:///{path}")
    assert code == 1
    assert "not an SQLite database" in err
    assert path.read_text() == "not a database at all\n" * 50


def test_a_bad_store_url_is_explained(tmp_path: Path) -> None:
    code, _, err = invoke("list", "--db", "sqlite://relative.db")
    assert code == 1
    assert "three slashes" in err


def test_json_is_also_a_flag(db: str) -> None:
    started = start(db, "--input", '{"name": "di"}')
    code, out, _ = invoke("show", str(started["instance_id"]), "--db", db, "--json")
    assert code == 0
    assert json.loads(out)["instance"]["instance_id"] == started["instance_id"]
    code, out, _ = invoke("list", "--db", db)
    assert code == 0 and not out.startswith("[")  # text stays the default


def test_worker_refuses_bad_settings_before_touching_the_store(tmp_path: Path) -> None:
    path = tmp_path / "never.db"
    code, _, err = invoke(
        "worker", "--db", f"sqlite:///{path}", "--flows", FLOWS, "--lease-ttl", "0s"
    )
    assert code == 1
    assert "lease_ttl must be at least 1s" in err
    assert not path.exists()


def test_worker_rejects_an_unknown_log_level(db: str) -> None:
    code, _, err = invoke("worker", "--db", db, "--flows", FLOWS, "--log-level", "chatty")
    assert code == 2
    assert "--log-level" in err


@pytest.mark.timeout(60)
def test_a_worker_process_runs_what_start_left_pending_and_drains_on_sigterm(
    db: str, tmp_path: Path
) -> None:
    instance_id = str(start(db, "--input", '{"name": "ivy"}')["instance_id"])
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "flowx.cli.main", "worker", "--db", db, "--flows", FLOWS,
            "--node-id", "cli-test-node", "--ready-file", str(ready),
            "--recovery-scan-interval", "1s", "--shutdown-drain-timeout", "5s",
            "--log-format", "json",
        ],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        state = None
        while time.monotonic() < deadline:
            code, out, _ = invoke("show", instance_id, "--db", db, "--json")
            assert code == 0
            state = json.loads(out)["instance"]["state"]
            if state == "Completed":
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        assert state == "Completed"
        assert ready.read_text() == "cli-test-node"
        proc.send_signal(signal.SIGTERM)
        _, logs = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, logs
    messages = [json.loads(line)["message"] for line in logs.splitlines()]
    assert "worker cli-test-node stopped" in messages
