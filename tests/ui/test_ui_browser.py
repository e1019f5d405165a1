"""The web UI end to end in headless Chromium (Debian's ``chromium``, driven by Playwright with
``executable_path``; never a downloaded browser), as an operator uses it (R9.7): sign in,
list and filter, open an instance and its timeline, cancel one behind a confirmation, replay a
failed one after its dry run, and be refused an action with the read-only token. Screenshots
go to ``test-artifacts/ui/``."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api import api_flows
from tests.api.live import LiveServer, live_server

playwright = pytest.importorskip("playwright.sync_api")

ADMIN = "ui-admin-token-000000001"
READER = "ui-reader-token-00000001"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "ui"
#: As the machine's browser runs headless here: no GPU, no calls home.
FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed: `make test` installs it (apt-get)")
    api_flows.BROKEN.clear()
    db = tmp_path_factory.mktemp("ui") / "journal.db"
    with live_server(db, run_here=True, api_token=ADMIN, api_read_token=READER) as live:
        host = live.host

        async def seed() -> dict[str, str]:
            ids = {}
            for name in ("ship-a", "ship-b", "ship-c"):
                ids[name] = (await host.start("api.ship", {"order_id": name})).instance_id
            ids["done"] = (await host.start("api.mail", {"order_id": "done"})).instance_id
            await host.wait_idle(timeout=10)
            api_flows.BROKEN.add("notify")
            try:
                ids["failed"] = (await host.start("api.mail", {"order_id": "bad"})).instance_id
                await host.wait_idle(timeout=10)
            finally:
                api_flows.BROKEN.clear()
            return ids

        yield live, live.call(seed)
    api_flows.BROKEN.clear()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield chromium
        chromium.close()


def _signed_in(browser: object, url: str, token: str) -> object:
    page = browser.new_context().new_page()  # type: ignore[attr-defined]
    page.goto(f"{url}/ui/")
    playwright.expect(page).to_have_url(re.compile(r"/ui/login"))
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    playwright.expect(page).to_have_url(re.compile(r"/ui/$"))
    return page


def test_an_operator_lists_filters_opens_and_cancels_an_instance(
    server: tuple[LiveServer, dict[str, str]], browser: object
) -> None:
    live, ids = server
    page = _signed_in(browser, live.url, ADMIN)
    rows = page.locator("#instances tr:has(td a)")
    playwright.expect(rows).to_have_count(5)
    page.screenshot(path=str(SHOTS / "instances.png"), full_page=True)

    page.select_option("select[name=state]", "Suspended")
    page.click("form.filters button[type=submit]")
    playwright.expect(rows).to_have_count(3)

    page.click(f"a[href='/ui/instances/{ids['ship-a']}']")
    playwright.expect(page.locator("#state")).to_have_text("Suspended")
    playwright.expect(page.locator("#timeline")).to_contain_text("api.reserve")
    page.screenshot(path=str(SHOTS / "instance.png"), full_page=True)

    page.fill("form[action$='/cancel'] input[name=reason]", "customer asked")
    page.click("#cancel")
    playwright.expect(page.locator("h1")).to_contain_text("Confirm: cancel")
    page.screenshot(path=str(SHOTS / "confirm-cancel.png"))
    page.click("#confirm")
    playwright.expect(page).to_have_url(re.compile(f"/ui/instances/{ids['ship-a']}$"))
    live.idle()
    page.goto(f"{live.url}/ui/instances/{ids['ship-a']}")
    playwright.expect(page.locator("#state")).to_have_text("Cancelled")
    playwright.expect(page.locator("#timeline")).to_contain_text("Compensated")
    page.screenshot(path=str(SHOTS / "cancelled.png"), full_page=True)


def test_an_operator_replays_a_failed_instance_after_seeing_its_dry_run(
    server: tuple[LiveServer, dict[str, str]], browser: object
) -> None:
    live, ids = server
    page = _signed_in(browser, live.url, ADMIN)
    page.goto(f"{live.url}/ui/instances/{ids['failed']}")
    playwright.expect(page.locator("#state")).to_have_text("Failed")
    page.fill("input[name=from_step]", "api.notify")
    page.click("#replay")
    dry = page.locator("#dry-run")
    playwright.expect(dry).to_contain_text("api.notify")
    page.screenshot(path=str(SHOTS / "replay-dry-run.png"))
    assert live.call(lambda: live.host.get(ids["failed"])).state.value == "Failed"  # dry only
    page.click("#confirm")
    playwright.expect(page).to_have_url(re.compile(f"/ui/instances/{ids['failed']}$"))
    live.idle()
    page.goto(f"{live.url}/ui/instances/{ids['failed']}")
    playwright.expect(page.locator("#state")).to_have_text("Completed")


def test_a_reader_sees_no_actions_and_is_refused_one(
    server: tuple[LiveServer, dict[str, str]], browser: object
) -> None:
    live, ids = server
    page = _signed_in(browser, live.url, READER)
    page.goto(f"{live.url}/ui/instances/{ids['ship-b']}")
    playwright.expect(page.locator("#state")).to_have_text("Suspended")
    playwright.expect(page.locator("#cancel")).to_have_count(0)
    response = page.request.post(
        f"{live.url}/ui/instances/{ids['ship-b']}/terminate",
        form={"reason": "reader", "confirmed": "yes"},
    )
    assert response.status == 403
    assert live.call(lambda: live.host.get(ids["ship-b"])).state.value == "Suspended"


def test_the_outbox_and_versions_pages(
    server: tuple[LiveServer, dict[str, str]], browser: object
) -> None:
    live, _ = server
    page = _signed_in(browser, live.url, ADMIN)
    page.goto(f"{live.url}/ui/versions")
    playwright.expect(page.locator("#versions")).to_contain_text("api.ship@1.0.0")
    page.screenshot(path=str(SHOTS / "versions.png"))
    page.goto(f"{live.url}/ui/outbox")
    playwright.expect(page.locator("#backlog")).to_contain_text("pending")
    page.screenshot(path=str(SHOTS / "outbox.png"))


def test_an_action_posted_from_another_site_is_refused(
    server: tuple[LiveServer, dict[str, str]], browser: object
) -> None:
    live, ids = server
    page = _signed_in(browser, live.url, ADMIN)
    response = page.request.post(
        f"{live.url}/ui/instances/{ids['ship-c']}/terminate",
        form={"reason": "forged", "confirmed": "yes"},
        headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
    )
    assert response.status == 403
    assert live.call(lambda: live.host.get(ids["ship-c"])).state.value == "Suspended"


def test_signing_out_forgets_the_token(
    server: tuple[LiveServer, dict[str, str]], browser: object
) -> None:
    live, ids = server
    page = _signed_in(browser, live.url, ADMIN)
    assert [c["name"] for c in page.context.cookies()] == ["flowx_token"]
    assert page.context.cookies()[0]["httpOnly"] is True
    page.click("header form[action='/ui/logout'] button")
    playwright.expect(page).to_have_url(re.compile(r"/ui/login$"))
    assert page.context.cookies() == []
    page.goto(f"{live.url}/ui/instances/{ids['ship-c']}")
    playwright.expect(page).to_have_url(re.compile(r"/ui/login"))
