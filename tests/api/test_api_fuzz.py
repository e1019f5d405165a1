"""Every API operation fuzzed from its OpenAPI document (R9.7): schemathesis generates valid
and invalid requests from ``docs/openapi.json`` and sends them over HTTP to a real server
(uvicorn, a SQLite journal holding instances in every state it can reach).

For each request: no 5xx (the journal is up, so not even the 503), the answer matches the
document, and a rejected request (4xx) leaves the journal exactly as it was — every row of
the instance, step, signal and outbox tables, and the retention policy.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from tests.api.api_flows import FLOWS
from tests.api.live import LiveServer, live_server

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "admin-token-for-the-fuzz-run"
#: The tables whose rows a rejected request must leave alone.
FLOW_IDS = [p.flow_id for p in FLOWS]
WATCHED = ("flow_instance", "flow_step", "flow_signal", "outbox_event", "retention_policy")

#: The admin token, given through the document's own security scheme: schemathesis then
#: also sends requests without it (and expects them refused).
schema = schemathesis.openapi.from_path(
    ROOT / "docs" / "openapi.json",
    config=schemathesis.Config.from_dict({"auth": {"openapi": {"HTTPBearer": {"bearer": ADMIN}}}}),
)


@dataclass
class Server:
    live: LiveServer
    ids: list[str]

    @property
    def url(self) -> str:
        return self.live.url

    def idle(self) -> None:
        self.live.idle()

    def digest(self) -> str:
        h = hashlib.sha256()
        with sqlite3.connect(f"file:{self.live.db}?mode=ro", uri=True) as conn:
            for table in WATCHED:
                for row in conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3"):
                    h.update(repr(row).encode())
        return h.hexdigest()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    db = tmp_path_factory.mktemp("fuzz") / "journal.db"
    with live_server(db, api_token=ADMIN) as live:
        host = live.host

        async def seed() -> list[str]:
            """Instances to aim at: Pending, Suspended at a signal, Cancelled, Completed."""
            ids = []
            for i in range(4):
                handle = await host.start("api.ship", {"order_id": f"F{i}"}, run_here=True)
                ids.append(handle.instance_id)
            await host.wait_idle(timeout=10)
            await host.cancel(ids[1], "seeded")
            await host.signal(ids[2], "shipped", {"carrier": "X", "tracking": "1"})
            await host.wait_idle(timeout=10)
            pending = await host.start("api.mail", {"order_id": "P"}, run_here=False)
            return [*ids, pending.instance_id]

        yield Server(live, live.call(seed))


def _aimed(case: Any, server: Server) -> None:
    """Half of the generated instance ids are swapped for a seeded one (chosen by the
    generated id's length, so the choice is Hypothesis's, and shrinks), so operations reach
    real instances in every state, not only 404s; so are half of the flow ids."""
    params = case.path_parameters or {}
    given = params.get("instance_id")
    if isinstance(given, str) and len(given) % 2 == 0:
        params["instance_id"] = server.ids[len(given) // 2 % len(server.ids)]
    flow = params.get("flow_id")
    if isinstance(flow, str) and len(flow) % 2 == 0:
        params["flow_id"] = FLOW_IDS[len(flow) // 2 % len(FLOW_IDS)]


@schema.parametrize()
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,  # the same cases every run: a fuzz failure is reproducible, never flaky
)
def test_no_request_gets_a_5xx_or_alters_the_journal_when_refused(
    case: Any, server: Server
) -> None:
    _aimed(case, server)
    wait = (case.query or {}).get("wait")
    if isinstance(wait, int | float) and not isinstance(wait, bool):
        case.query["wait"] = min(wait, 0.2)  # a valid long poll, kept short
    server.idle()
    before = server.digest()
    response = case.call(base_url=server.url)
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text}"
    if response.status_code >= 400:
        server.idle()
        assert server.digest() == before, f"a refused {case.method} {case.path} wrote"
    # Every check but one: a request the document allows may still name a step or a moment
    # no instance has, and be refused for it (422) without that being a fault.
    case.validate_response(response, excluded_checks=[positive_data_acceptance])
