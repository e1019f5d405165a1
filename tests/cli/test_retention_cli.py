"""`flowx retention show|set|sweep` (R2.13) on a real SQLite file, through click's runner:
every `-o json` parsed, every refusal's exit code checked."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import flowx
from flowx.testing import FakeClock
from tests.cli.runner import invoke
from tests.cli.wait_flows import FLOWS, Order, mail


def old_instances(db: str, count: int) -> list[str]:
    """``count`` instances of ``cli.mail`` that completed in 2020: long past 30 days."""

    async def main() -> list[str]:
        clock = FakeClock(datetime(2020, 1, 1, tzinfo=UTC))
        settings = flowx.HostSettings.load(recovery=False, timers=False, retention=False)
        path = db.removeprefix("sqlite:///")
        async with flowx.FlowHost(
            store=flowx.sqlite(path), flows=FLOWS, settings=settings, clock=clock
        ) as host:
            ids = [
                (await host.start(mail, Order(order_id=f"o{n}"))).instance_id for n in range(count)
            ]
            await host.wait_idle(timeout=10)
            return ids

    return asyncio.run(main())


def test_show_lists_the_seeded_policies_and_set_changes_one(db: str) -> None:
    assert invoke("migrate", "--db", db)[0] == 0
    code, out, err = invoke("retention", "show", "--db", db, "-o", "json")
    assert code == 0, err
    assert json.loads(out) == [
        {"flow_id": "*", "state_class": "Completed", "retain_for_seconds": 30 * 86_400},
        {"flow_id": "*", "state_class": "Failed", "retain_for_seconds": 180 * 86_400},
        {"flow_id": "*", "state_class": "OutboxPublished", "retain_for_seconds": 7 * 86_400},
        {"flow_id": "*", "state_class": "Suspended", "retain_for_seconds": None},
    ]
    code, out, err = invoke(
        "retention",
        "set",
        "--flow",
        "cli.mail",
        "--class",
        "Completed",
        "--keep",
        "12h",
        "--db",
        db,
        "-o",
        "json",
    )
    assert code == 0, err
    assert json.loads(out) == {
        "flow_id": "cli.mail",
        "state_class": "Completed",
        "retain_for_seconds": 12 * 3600,
    }
    code, out, _ = invoke(
        "retention",
        "set",
        "--flow",
        "cli.ship",
        "--class",
        "Failed",
        "--keep",
        "never",
        "--db",
        db,
    )
    assert (code, out.strip()) == (0, "cli.ship Failed: never deleted (from the next sweep)")
    code, out, _ = invoke("retention", "show", "--db", db)
    assert code == 0
    [line] = [row for row in out.splitlines() if row.startswith("cli.mail")]
    assert line.split() == ["cli.mail", "Completed", "12:00:00"]
    shown = {
        (p["flow_id"], p["state_class"]): p["retain_for_seconds"]
        for p in json.loads(invoke("retention", "show", "--db", db, "-o", "json")[1])
    }
    assert shown[("cli.mail", "Completed")] == 12 * 3600
    assert shown[("cli.ship", "Failed")] is None


def test_bad_policies_are_usage_errors_and_change_nothing(db: str) -> None:
    assert invoke("migrate", "--db", db)[0] == 0
    before = invoke("retention", "show", "--db", db, "-o", "json")[1]
    for args, says in (
        (("--class", "Completed", "--keep", "banana"), "write e.g. 30d"),
        (("--class", "Completed", "--keep", "10s"), "outside 1 minute to 3650 days"),
        (("--class", "Suspended", "--keep", "1d"), "Invalid value for '--class'"),
        (("--flow", "x", "--class", "OutboxPublished", "--keep", "1d"), "per journal"),
    ):
        code, _, err = invoke("retention", "set", *args, "--db", db)
        assert code == 2, (args, err)
        assert says in err
        assert "Traceback" not in err
    code, out, _ = invoke(
        "retention", "set", "--class", "Completed", "--keep", "10s", "--db", db, "-o", "json"
    )
    assert (code, json.loads(out)["error"]["exit"]) == (2, 2)
    assert invoke("retention", "show", "--db", db, "-o", "json")[1] == before


def test_sweep_counts_on_a_dry_run_then_archives_and_deletes(db: str, tmp_path: Path) -> None:
    ids = old_instances(db, 3)
    code, out, err = invoke("retention", "sweep", "--dry-run", "--db", db, "-o", "json")
    assert code == 0, err
    assert json.loads(out) == {
        "dry_run": True,
        "busy": False,
        "deleted": 3,
        "archived": 0,
        "held_back": 0,
        "held_back_by": {},
        "outbox_deleted": 0,
        "outbox_held_back": 0,
    }
    code, out, _ = invoke("show", ids[0], "--db", db, "-o", "json")
    assert code == 0  # still there

    archive = tmp_path / "archive"
    code, out, err = invoke(
        "retention", "sweep", "--archive-dir", str(archive), "--db", db, "-o", "json"
    )
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["deleted"], doc["archived"]) == (3, 3)
    [path] = list(archive.glob("*.jsonl.gz"))
    assert sorted(a.instance.instance_id for a in flowx.read_archive(path)) == sorted(ids)
    code, _, err = invoke("show", ids[0], "--db", db)
    assert code == 3
