"""The `flowx` command, run in-process through click's runner on a real SQLite file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import flowx
from flowx.cli.main import cli
from tests.cli.cli_flows import greeting

FLOWS = "tests.cli.cli_flows:FLOWS"


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def start(db: str, *extra: str) -> dict[str, object]:
    code, out, err = invoke(
        "start", "cli.greeting", "--db", db, "--flows", FLOWS, "-o", "json", *extra
    )
    assert code == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


async def run_instance(db: str, instance_id: str) -> None:
    path = db.removeprefix("sqlite:///")
    async with flowx.FlowHost(store=flowx.sqlite(path), flows=[greeting], recovery=False) as host:
        assert await host.resume(instance_id) == "resumed"
        await host.wait_idle()


def test_start_leaves_a_pending_instance_for_a_worker(db: str) -> None:
    started = start(db, "--input", '{"name": "ada"}')
    assert started["created"] is True
    code, out, _ = invoke("list", "--db", db, "-o", "json")
    assert code == 0
    rows = json.loads(out)
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


def test_an_unknown_flow_exits_3(db: str) -> None:
    code, _, err = invoke("start", "cli.nope", "--db", db, "--flows", FLOWS)
    assert code == 3
    assert "cli.nope" in err and "cli.greeting@1.0.0" in err


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
    code, out, _ = invoke("list", "--db", db, "--limit", "2")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["instance", "flow", "version", "state", "created", "updated"]
    assert sum(1 for line in lines if "cli.greeting" in line) == 2
    cursor = lines[-1].removeprefix("more: --before ")
    code, out, _ = invoke("list", "--db", db, "--before", cursor, "-o", "json")
    page_two = [r["instance_id"] for r in json.loads(out)]
    assert len(page_two) == 1 and page_two[0] in ids


def test_show_of_an_unknown_instance_exits_3(db: str) -> None:
    code, _, err = invoke("show", "00000000-0000-0000-0000-000000000000", "--db", db)
    assert code == 3
    assert "no flow instance" in err


def test_migrate_reports_the_schema_version(db: str) -> None:
    code, out, _ = invoke("migrate", "--db", db, "-o", "json")
    assert code == 0
    assert json.loads(out)["schema_version"] >= 1


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
