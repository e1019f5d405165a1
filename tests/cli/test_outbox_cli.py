"""``flowx outbox dead-letters`` and ``flowx outbox retry`` (R5.5), on a real SQLite file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner

from flowx.cli.main import cli
from flowx.stores.sqlite import SqliteStores
from flowx.testing.conformance._support import at
from flowx.testing.conformance.outbox import stage


async def _dead_letter_one(path: Path) -> tuple[str, str]:
    stores = SqliteStores(path)
    await stores.open()
    try:
        staged = await stage(stores, ["k1", "k1"])
        async with stores.outbox.claim(limit=10, now=at(100), owner="p") as claim:
            claim.refused(staged[0].event_id, reason="413 message too large", dead=True)
        return staged[0].event_id, staged[1].event_id
    finally:
        await stores.close()


def test_an_operator_sees_a_dead_letter_and_resends_it(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'flowx.db'}"
    dead, alive = asyncio.run(_dead_letter_one(tmp_path / "flowx.db"))
    runner = CliRunner()

    listed = runner.invoke(cli, ["outbox", "dead-letters", "--db", db, "--json"])
    assert listed.exit_code == 0, listed.output
    doc = json.loads(listed.stdout)
    assert doc["pending"] == 1
    assert [(d["event_id"], d["reason"], d["attempts"]) for d in doc["dead_letters"]] == [
        (dead, "413 message too large", 1)
    ]
    text = runner.invoke(cli, ["outbox", "dead-letters", "--db", db])
    assert dead in text.stdout and "413 message too large" in text.stdout

    resent = runner.invoke(cli, ["outbox", "retry", dead, "--db", db])
    assert resent.exit_code == 0, resent.output
    again = json.loads(
        runner.invoke(cli, ["outbox", "dead-letters", "--db", db, "-o", "json"]).stdout
    )
    assert again == {"pending": 2, "dead_letters": []}

    # A second retry, or an event that is not a dead letter: not found, exit code 3.
    for event_id in (dead, alive):
        missing = runner.invoke(cli, ["outbox", "retry", event_id, "--db", db])
        assert missing.exit_code == 3
        assert "no dead letter" in missing.stderr
