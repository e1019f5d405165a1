"""The HTTP API (R9.7), each operation's happy path and its errors: 401, 403, 404, 409, 422
and the 503 of SPEC §8, with a client speaking HTTP to the ASGI app over a real SQLite journal
(and PostgreSQL behind a fault proxy for the 503)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

import flowx
from flowx.api import create_app
from flowx.hosting.stores import postgres
from tests.api import api_flows
from tests.api.api_flows import FLOWS
from tests.postgres_support import PG_DSN
from tests.support.fault_proxy import FaultProxy

ADMIN = "admin-token-for-the-api-tests"
READER = "reader-token-for-the-api-tests"
SHIPMENT = {"carrier": "DHL", "tracking": "JD0001"}


@dataclass
class Api:
    host: flowx.FlowHost
    client: httpx.AsyncClient

    async def start(self, flow: str = "api.ship", **body: Any) -> httpx.Response:
        body.setdefault("input", {"order_id": "A1"})
        return await self.client.post(f"/v1/flows/{flow}/instances", json=body)

    async def started(self, flow: str = "api.ship", **body: Any) -> str:
        response = await self.start(flow, **body)
        assert response.status_code == 201, response.text
        return str(response.json()["instance_id"])

    async def state(self, instance_id: str) -> str:
        response = await self.client.get(f"/v1/instances/{instance_id}")
        assert response.status_code == 200, response.text
        return str(response.json()["instance"]["state"])

    async def ended(self, instance_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/v1/instances/{instance_id}/result?wait=10")
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def suspended(self, instance_id: str) -> None:
        """Wait until the instance waits at its signal (it runs in this process)."""
        for _ in range(200):
            if await self.state(instance_id) == "Suspended":
                return
            await self.host.wait_idle(timeout=5)
        raise AssertionError(f"{instance_id} never reached its wait")


def _client(app: Any, token: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://flowx.test", headers=headers
    )


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    api_flows.BROKEN.clear()
    settings = flowx.HostSettings.load(
        api_token=ADMIN, api_read_token=READER, recovery=False, timers=False
    )
    host = flowx.FlowHost(
        store=flowx.sqlite(str(tmp_path / "j.db")), flows=FLOWS, settings=settings
    )
    async with host, _client(create_app(host, run_here=True), ADMIN) as client:
        yield Api(host, client)
    api_flows.BROKEN.clear()


async def test_a_start_runs_waits_for_its_signal_and_answers_its_result(api: Api) -> None:
    response = await api.start(input={"order_id": "A1", "qty": 2}, idempotency_key="order-A1")
    assert response.status_code == 201
    doc = response.json()
    assert doc["created"] is True and doc["flow_id"] == "api.ship"
    iid = doc["instance_id"]
    await api.suspended(iid)

    pending = await api.client.get(f"/v1/instances/{iid}/result?wait=0.1")
    assert pending.status_code == 202 and pending.json()["state"] == "Suspended"
    shown = (await api.client.get(f"/v1/instances/{iid}")).json()
    assert shown["waiting"]["kind"] == "signal" and shown["waiting"]["signal"] == "shipped"

    sent = await api.client.post(
        f"/v1/instances/{iid}/signals", json={"name": "shipped", "payload": SHIPMENT, "key": "s1"}
    )
    assert sent.status_code == 200 and sent.json()["status"] == "woken", sent.text
    again = await api.client.post(
        f"/v1/instances/{iid}/signals", json={"name": "shipped", "payload": SHIPMENT, "key": "s1"}
    )
    assert again.json()["status"] == "duplicate"

    result = await api.ended(iid)
    assert result["state"] == "Completed"
    assert result["result"]["reservation"] == "R-A1x2"
    assert result["result"]["shipment"] == SHIPMENT
    steps = (await api.client.get(f"/v1/instances/{iid}/steps")).json()["steps"]
    assert next(s["step_name"] for s in steps if s["outcome"] == "Success") == "api.reserve"


async def test_a_repeated_idempotency_key_starts_nothing_and_another_input_conflicts(
    api: Api,
) -> None:
    first = await api.start(input={"order_id": "K"}, idempotency_key="k-1")
    second = await api.start(input={"order_id": "K"}, idempotency_key="k-1")
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json()["instance_id"] == first.json()["instance_id"]
    assert second.json()["created"] is False
    clash = await api.start(input={"order_id": "other"}, idempotency_key="k-1")
    assert clash.status_code == 409
    assert clash.json()["error"]["code"] == "flow.idempotency_conflict"
    listed = (await api.client.get("/v1/instances")).json()["instances"]
    assert len(listed) == 1


async def test_an_invalid_input_is_422_naming_each_field_and_stores_nothing(api: Api) -> None:
    response = await api.start(input={"order_id": "", "qty": 0})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "flow.input_invalid"
    assert sorted(f["loc"][-1] for f in error["fields"]) == ["order_id", "qty"]

    misspelt = await api.client.post(
        "/v1/flows/api.ship/instances", json={"input": {"order_id": "A"}, "idempotency": "x"}
    )
    assert misspelt.status_code == 422
    assert misspelt.json()["error"]["code"] == "request.invalid"
    assert misspelt.json()["error"]["fields"][0]["loc"] == ["body", "idempotency"]

    not_json = await api.client.post(
        "/v1/flows/api.ship/instances",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert not_json.status_code == 422
    assert (await api.client.get("/v1/instances")).json()["instances"] == []


async def test_what_does_not_exist_is_404(api: Api) -> None:
    missing = "5b0c2a7e-0000-4000-8000-000000000000"
    for response in (
        await api.client.get(f"/v1/instances/{missing}"),
        await api.client.get(f"/v1/instances/{missing}/steps"),
        await api.client.get(f"/v1/instances/{missing}/result"),
        await api.client.post(f"/v1/instances/{missing}/cancel", json={"reason": "test"}),
        await api.client.post(
            f"/v1/instances/{missing}/signals", json={"name": "shipped", "payload": SHIPMENT}
        ),
        await api.client.post(f"/v1/outbox/dead-letters/{missing}/retry"),
        await api.start("no.such.flow"),
        await api.client.get("/v1/instances/not-a-uuid/result"),
        await api.client.post("/v1/instances/not-a-uuid/cancel", json={"reason": "x"}),
        await api.client.post("/v1/outbox/dead-letters/not-a-uuid/retry"),
    ):
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"].endswith("not_found")


async def test_an_action_on_an_instance_in_the_wrong_state_is_409(api: Api) -> None:
    iid = await api.started("api.mail")
    assert (await api.ended(iid))["state"] == "Completed"
    for response in (
        await api.client.post(
            f"/v1/instances/{iid}/signals", json={"name": "shipped", "payload": SHIPMENT}
        ),
        await api.client.post(f"/v1/instances/{iid}/cancel", json={"reason": "too late"}),
        await api.client.post(f"/v1/instances/{iid}/replay", json={"from_step": "api.notify"}),
    ):
        assert response.status_code == 409, response.text
    assert await api.state(iid) == "Completed"


async def test_tokens_gate_every_operation_and_a_reader_may_only_read(api: Api) -> None:
    iid = await api.started()
    await api.suspended(iid)
    app = create_app(api.host)
    async with _client(app, None) as anonymous, _client(app, "not-the-token-at-all") as wrong:
        for client in (anonymous, wrong):
            refused = await client.get("/v1/instances")
            assert refused.status_code == 401
            assert refused.headers["www-authenticate"].startswith("Bearer")
            assert refused.json()["error"]["code"] == "api.unauthenticated"
            stop = await client.post(f"/v1/instances/{iid}/cancel", json={"reason": "x"})
            assert stop.status_code == 401
        assert (await anonymous.get("/healthz")).status_code == 200  # probes need no token
    async with _client(app, READER) as reader:
        assert (await reader.get(f"/v1/instances/{iid}")).status_code == 200
        assert (await reader.get("/v1/outbox")).status_code == 200
        for response in (
            await reader.post(f"/v1/instances/{iid}/cancel", json={"reason": "reader"}),
            await reader.post(f"/v1/instances/{iid}/terminate", json={"reason": "reader"}),
            await reader.post(
                f"/v1/instances/{iid}/signals", json={"name": "shipped", "payload": SHIPMENT}
            ),
            await reader.post("/v1/flows/api.ship/instances", json={"input": {"order_id": "R"}}),
        ):
            assert response.status_code == 403, response.text
            assert response.json()["error"]["code"] == "api.forbidden"
    assert await api.state(iid) == "Suspended"
    assert len((await api.client.get("/v1/instances")).json()["instances"]) == 1


async def test_the_list_filters_and_pages_newest_first_by_keyset(api: Api) -> None:
    ids = [await api.started("api.mail", input={"order_id": f"M{i}"}) for i in range(5)]
    waiting = await api.started("api.ship")
    await api.suspended(waiting)
    for iid in ids:
        await api.ended(iid)
    seen: list[str] = []
    before = None
    while True:
        params: dict[str, Any] = {"flow": "api.mail", "limit": 2}
        if before:
            params["before"] = before
        page = (await api.client.get("/v1/instances", params=params)).json()
        seen += [i["instance_id"] for i in page["instances"]]
        before = page["next"]
        if before is None:
            break
    assert seen == list(reversed(ids))
    suspended = (await api.client.get("/v1/instances", params={"state": "Suspended"})).json()
    assert [i["instance_id"] for i in suspended["instances"]] == [waiting]
    future = (await api.client.get("/v1/instances", params={"since": "2999-01-01"})).json()
    assert future["instances"] == []
    for bad in ({"since": "yesterday"}, {"before": "nope"}, {"state": "Sleeping"}, {"limit": 0}):
        response = await api.client.get("/v1/instances", params=bad)
        assert response.status_code == 422, (bad, response.text)


async def test_cancel_compensates_terminate_does_not_and_both_are_idempotent(api: Api) -> None:
    cancelled, terminated = await api.started(), await api.started()
    await api.suspended(cancelled)
    await api.suspended(terminated)
    response = await api.client.post(f"/v1/instances/{cancelled}/cancel", json={"reason": "dup"})
    assert response.status_code == 200 and response.json()["mode"] == "cancel", response.text
    assert (await api.ended(cancelled))["state"] == "Cancelled"
    steps = (await api.client.get(f"/v1/instances/{cancelled}/steps")).json()["steps"]
    assert [s["step_name"] for s in steps if s["outcome"] == "Compensated"] == ["api.reserve"]
    again = await api.client.post(f"/v1/instances/{cancelled}/cancel", json={"reason": "dup"})
    assert again.status_code == 200 and again.json()["state"] == "Cancelled"

    response = await api.client.post(
        f"/v1/instances/{terminated}/terminate", json={"reason": "fraud"}
    )
    assert response.status_code == 200, response.text
    assert (await api.ended(terminated))["state"] == "Terminated"
    steps = (await api.client.get(f"/v1/instances/{terminated}/steps")).json()["steps"]
    assert not [s for s in steps if s["outcome"] == "Compensated"]
    no_reason = await api.client.post(f"/v1/instances/{terminated}/cancel", json={"reason": ""})
    assert no_reason.status_code == 422


async def test_replay_shows_its_dry_run_then_re_runs_the_failed_step(api: Api) -> None:
    api_flows.BROKEN.add("notify")
    iid = await api.started("api.mail")
    assert (await api.ended(iid))["state"] == "Failed"
    api_flows.BROKEN.clear()
    dry = await api.client.post(
        f"/v1/instances/{iid}/replay", json={"from_step": "api.notify", "dry_run": True}
    )
    assert dry.status_code == 200, dry.text
    assert dry.json()["dry_run"] is True and dry.json()["reruns"]
    assert await api.state(iid) == "Failed"  # a dry run changes nothing
    done = await api.client.post(f"/v1/instances/{iid}/replay", json={"from_step": "api.notify"})
    assert done.status_code == 200, done.text
    result = await api.ended(iid)
    assert result["state"] == "Completed" and result["result"]["note"] == "sent"
    bad = await api.client.post(
        f"/v1/instances/{iid}/replay", json={"from_step": "api.notify", "deadline": "soon"}
    )
    assert bad.status_code == 422


async def test_flows_outbox_health_and_readiness(api: Api) -> None:
    flows = (await api.client.get("/v1/flows")).json()["flows"]
    assert {f["flow_id"] for f in flows} == {"api.ship", "api.mail", "api.quote"}
    ship = next(f for f in flows if f["flow_id"] == "api.ship")
    assert ship["durable"] is True and "order_id" in ship["input_schema"]["properties"]
    assert (await api.client.get("/v1/outbox")).json() == {"pending": 0, "dead_letters": []}
    assert (await api.client.get("/healthz")).json() == {"status": "ok"}
    ready = await api.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"ready": True, "journal": "up", "draining": False}


async def test_an_ephemeral_flow_runs_within_the_request(api: Api) -> None:
    response = await api.start("api.quote", input={"order_id": "Q", "qty": 3})
    assert response.status_code == 201, response.text
    assert response.json()["state"] == "Completed"
    assert response.json()["result"]["reservation"] == "R-Qx3"


# -- the journal out of reach (SPEC §8) ----------------------------------------------------


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    target = urlsplit(PG_DSN)
    fault = FaultProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await fault.start()
    yield fault
    await fault.stop()


async def test_durable_work_answers_503_with_retry_after_while_the_journal_is_down(
    proxy: FaultProxy, pg_schema: Callable[[], str]
) -> None:
    target = urlsplit(PG_DSN)
    url = f"postgresql://{target.username or 'postgres'}@127.0.0.1:{proxy.port}{target.path}"
    store = postgres(url, schema=pg_schema(), connect_timeout=2, min_size=1, max_size=4)
    settings = flowx.HostSettings.load(api_token=ADMIN, recovery=False, timers=False)
    host = flowx.FlowHost(store=store, flows=FLOWS, settings=settings)
    async with host, _client(create_app(host, run_here=True), ADMIN) as client:
        api = Api(host, client)
        iid = await api.started("api.mail")
        await proxy.refuse()
        for response in (
            await api.start("api.mail", input={"order_id": "down"}),
            await client.get("/v1/instances"),
            await client.get(f"/v1/instances/{iid}"),
            await client.get("/readyz"),
        ):
            assert response.status_code == 503, response.text
            assert int(response.headers["retry-after"]) > 0
        down = await client.get("/readyz")
        assert down.json()["journal"] == "down" and down.json()["ready"] is False
        quote = await api.start("api.quote", input={"order_id": "Q"})
        assert quote.status_code == 201 and quote.json()["state"] == "Completed"
        await proxy.forward()
        for _ in range(100):  # what a client does with a 503: retry after a while
            response = await api.start("api.mail", input={"order_id": "back"})
            if response.status_code != 503:
                break
            await asyncio.sleep(0.1)
        assert response.status_code == 201, response.text
        assert (await api.ended(response.json()["instance_id"]))["state"] == "Completed"
        assert (await client.get("/readyz")).status_code == 200


def test_an_empty_token_is_refused_at_start_up_not_taken_as_admin() -> None:
    with pytest.raises(flowx.SettingsError, match="at least 16 characters"):
        flowx.HostSettings.load(api_token="")


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_the_ui_cookie_is_http_only_strict_and_secure_over_https(
    api: Api, scheme: str
) -> None:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(api.host, run_here=True)),
        base_url=f"{scheme}://flowx.test",
    ) as browser:
        signed = await browser.post("/ui/login", data={"token": ADMIN, "next": "/ui/"})
        assert signed.status_code == 303
        cookie = signed.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert ("secure" in cookie.split("; ")) is (scheme == "https")
        assert (await browser.get("/ui/")).status_code == 200
        forged = await browser.post("/ui/logout", headers={"Origin": "http://evil.example"})
        assert forged.status_code == 403
        out = await browser.post("/ui/logout", headers={"Origin": f"{scheme}://flowx.test"})
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
        assert (await browser.get("/ui/")).status_code == 303  # back to the sign-in


async def test_a_signal_by_correlation_id_goes_to_the_one_live_instance_started_with_it(
    api: Api,
) -> None:
    """Issue 18: ``POST /v1/correlations/{id}/signals`` resolves like the ingress and the CLI:
    the one instance not ended gets it, a repeat with its key is a duplicate, an unknown id is
    404 and several live instances 422 ``signal.ambiguous_correlation``."""
    iid = await api.started(input={"order_id": "C1"}, correlation_id="po-1")
    await api.suspended(iid)
    body = {"name": "shipped", "payload": SHIPMENT, "key": "c1"}
    sent = await api.client.post("/v1/correlations/po-1/signals", json=body)
    assert sent.status_code == 200, sent.text
    assert (sent.json()["instance_id"], sent.json()["status"]) == (iid, "woken")
    again = await api.client.post("/v1/correlations/po-1/signals", json=body)
    assert again.json()["status"] == "duplicate"
    unknown = await api.client.post("/v1/correlations/po-none/signals", json=body)
    assert unknown.status_code == 404 and "'po-none'" in unknown.json()["error"]["message"]
    for order_id in ("C2", "C3"):
        await api.suspended(await api.started(input={"order_id": order_id}, correlation_id="po-2"))
    ambiguous = await api.client.post("/v1/correlations/po-2/signals", json=body)
    assert ambiguous.status_code == 422, ambiguous.text
    assert ambiguous.json()["error"]["code"] == "signal.ambiguous_correlation"
