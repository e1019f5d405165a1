"""`flowx doctor` on a real SQLite file: what it reports, in text and `-o json`, and that it
exits 1 naming each problem (issue 15 item 4)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import UTC, datetime

import flowx
from flowx.testing import FakeClock
from tests.cli.runner import invoke
from tests.cli.wait_flows import FLOWS, Order, mail, shipping


def _journal(db: str) -> None:
    """One instance queued in 2020 and never run (stuck), one Completed, one waiting."""

    async def main() -> None:
        path = db.removeprefix("sqlite:///")
        settings = flowx.HostSettings.load(recovery=False, timers=False, retention=False)
        old = FakeClock(datetime(2020, 1, 1, tzinfo=UTC))
        async with flowx.FlowHost(
            store=flowx.sqlite(path), flows=FLOWS, settings=settings, clock=old
        ) as host:
            await host.start(mail, Order(order_id="stuck"), run_here=False)
        async with flowx.FlowHost(store=flowx.sqlite(path), flows=FLOWS, settings=settings) as host:
            await host.start(mail, Order(order_id="done"))
            await host.start(shipping, Order(order_id="waits"))
            await host.wait_idle(timeout=10)

    asyncio.run(main())


def test_doctor_reports_the_journal_and_names_what_needs_attention(db: str) -> None:
    _journal(db)
    code, out, err = invoke("doctor", "--db", db, "-o", "json")
    assert code == 1, err
    doc = json.loads(out)
    assert doc["ok"] is False
    assert doc["store"]["schema_version"] >= 10
    assert doc["instances"] == {"Completed": 1, "Pending": 1, "Suspended": 1}
    assert doc["stuck"] == {"count": 1, "at_least": False}
    assert doc["outbox"] == {"pending": 0, "dead_letters": 0}
    assert doc["retention"]["would_delete"] == 0
    assert doc["versions"] == {
        "cli.mail@1.0.0": {"unfinished": 1, "carried": None},
        "cli.ship@1.0.0": {"unfinished": 1, "carried": None},
    }
    assert doc["settings"]["lease_ttl"] == 30.0
    [problem] = doc["problems"]
    assert problem.startswith("1 instance(s) nobody has written to")

    code, out, _ = invoke(
        "doctor", "--db", db, "--flows", "tests.cli.cli_flows:FLOWS", "-o", "json"
    )
    doc = json.loads(out)
    assert doc["versions"]["cli.ship@1.0.0"] == {"unfinished": 1, "carried": False}
    assert any("do not carry: cli.mail@1.0.0 (1), cli.ship@1.0.0 (1)" in p for p in doc["problems"])

    code, out, _ = invoke("doctor", "--db", db)
    assert code == 1
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert lines["stuck"].split()[1] == "1"
    assert lines["problem"].startswith("problem    1 instance(s)")


def test_doctor_of_a_healthy_journal_exits_0(db: str) -> None:
    assert invoke("migrate", "--db", db)[0] == 0
    code, out, err = invoke("doctor", "--db", db)
    assert code == 0, err
    assert out.splitlines()[-1] == "ok         nothing needs attention"
    code, _, err = invoke("doctor", "--db", db + ".missing")
    assert code == 3 and "no journal at" in err


def test_doctor_of_a_journal_at_an_older_schema_names_the_migration(db: str) -> None:
    """This code cannot read a journal an older release left: doctor says so, with what to
    run, rather than failing like a read command."""
    path = db.removeprefix("sqlite:///")
    assert invoke("migrate", "--db", db)[0] == 0
    conn = sqlite3.connect(path)
    with conn:
        (latest,) = conn.execute("SELECT max(version) FROM flowx_schema_migrations").fetchone()
        conn.execute("DELETE FROM flowx_schema_migrations WHERE version = ?", (latest,))
    conn.close()
    code, out, err = invoke("doctor", "--db", db, "-o", "json")
    assert code == 1, err
    doc = json.loads(out)
    [problem] = doc["problems"]
    assert (
        f"is at schema {latest - 1}, this FlowX needs {latest}" in problem
        and "flowx migrate" in problem
    )
    assert doc["settings"]["lease_ttl"] == 30.0
