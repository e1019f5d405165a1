"""Secrets through a real flow (R9.8, R5.1), on SQLite and PostgreSQL.

A payment's card number goes in as the input, comes back from a step as a token, arrives in a
signal, is quoted by a failing attempt's error, and is emitted in an event. The code that uses
it gets it intact — on the node that started the flow and on another node that resumes it —
and the canary test then greps everything the journal holds (the SQLite file, a ``pg_dump``),
the logs at DEBUG and ``flowx show -o json``: the secret is nowhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import SecretStr

import flowx
from flowx.cli.main import cli
from flowx.sealing import MARK, generate_key
from tests.postgres_support import PG_DSN
from tests.secrets import secret_flows
from tests.secrets.secret_flows import CANARY, FLOWS, Billing, Payment
from tests.support.hosts import fold_settings

KEYS = f"k1:{generate_key()}"
SECRETS = (CANARY, f"tok-{CANARY}", f"ref-{CANARY}", f"otp-{CANARY}", "DE89370400440532013000")


@pytest.fixture(params=["sqlite", "postgres"])
def journal(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: Callable[[], str]
) -> tuple[str, Callable[[], Any], Callable[[], bytes]]:
    """A store kind, a maker of store objects on one journal, and a dump of all it holds."""
    if request.param == "sqlite":
        path = tmp_path / "journal.db"

        def sqlite_dump() -> bytes:
            with sqlite3.connect(path) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            files = [path, *path.parent.glob("journal.db-*")]
            return b"".join(f.read_bytes() for f in files if f.exists())

        return f"sqlite:///{path}", lambda: flowx.sqlite(path), sqlite_dump
    schema = pg_schema()
    url = f"{PG_DSN}?flowx_schema={schema}"

    def pg_dump() -> bytes:
        return subprocess.run(
            ["pg_dump", "--no-owner", "-n", schema, PG_DSN],
            check=True,
            capture_output=True,
            timeout=60,
        ).stdout

    return url, lambda: flowx.postgres(PG_DSN, schema=schema), pg_dump


@pytest.fixture
async def hosts() -> AsyncIterator[Callable[..., Any]]:
    made: list[flowx.FlowHost] = []

    async def make(store: Any, **kw: Any) -> flowx.FlowHost:
        kw.setdefault("recovery", False)
        kw.setdefault("timers", False)
        kw.setdefault("settings", flowx.HostSettings.load(encryption_keys=KEYS))
        host = flowx.FlowHost(store=store, flows=FLOWS, **fold_settings(kw))
        await host.open()
        made.append(host)
        return host

    yield make
    for host in made:
        await host.drain(timeout=2)


def _payment(order_id: str) -> Payment:
    return Payment(
        order_id=order_id,
        card=CANARY,  # type: ignore[arg-type]  # pydantic takes the str
        billing=Billing(name="Holder-Zed", iban="DE89370400440532013000"),
    )


async def _pay_across_two_nodes(
    make: Callable[..., Any], store: Callable[[], Any]
) -> tuple[str, flowx.FlowHost]:
    """Start on one node, which runs to the wait; resume on another, by the signal."""
    secret_flows.SEEN.clear()
    first = await make(store())
    handle = await first.start("pay.card", _payment("o-1"), idempotency_key="order-o-1")
    await first.wait_idle(timeout=10)
    assert (await first.get(handle.instance_id)).state.value == "Suspended"
    assert secret_flows.SEEN == {"card": CANARY, "iban": "DE89370400440532013000"}
    await first.drain(timeout=2)

    second = await make(store())
    receipt = await second.signal(handle.instance_id, "otp", json.dumps({"code": f"otp-{CANARY}"}))
    assert receipt.status == "woken"
    state = await (
        await second.start("pay.card", _payment("o-1"), idempotency_key="order-o-1")
    ).result()
    assert state.token.get_secret_value() == f"tok-{CANARY}"
    assert state.reference == f"ref-{CANARY}"  # sealed in its row and in the state, opened
    assert state.otp.code.get_secret_value() == f"otp-{CANARY}"
    assert state.receipt == "receipt-o-1"
    return handle.instance_id, second


async def test_the_code_gets_every_secret_intact_and_nothing_stored_holds_one(
    journal: tuple[str, Callable[[], Any], Callable[[], bytes]],
    hosts: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, store, dump = journal
    secret_flows.FAILED_ONCE.clear()
    caplog.set_level(logging.DEBUG)
    instance_id, _ = await _pay_across_two_nodes(hosts, store)

    stored = dump()
    assert stored.count(MARK.encode()) >= 4  # the input, the state, the results: sealed
    for secret in SECRETS:
        assert secret.encode() not in stored, f"{secret!r} is in the journal"
    assert b"declined by the issuer" in stored  # the failed attempt is there, masked
    assert b"**********" in stored
    assert b'"holder":"[redacted]"' in stored  # the declared name, at the top and nested

    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "declined by the issuer" in logged or instance_id in logged  # the logs were caught
    for secret in SECRETS:
        assert secret not in logged

    args = ["show", instance_id, "--db", url, "-o", "json"]
    shown = await asyncio.to_thread(CliRunner().invoke, cli, args)  # the CLI runs its own loop
    assert shown.exit_code == 0, shown.output
    assert instance_id in shown.output and "**********" in shown.output
    for secret in SECRETS:
        assert secret not in shown.output


async def test_the_event_redacts_every_sensitive_member_at_every_depth(
    journal: tuple[str, Callable[[], Any], Callable[[], bytes]], hosts: Callable[..., Any]
) -> None:
    _, store, _ = journal
    secret_flows.FAILED_ONCE.clear()
    instance_id, second = await _pay_across_two_nodes(hosts, store)
    assert second.store is not None
    (event,) = await second.store.journal.events(instance_id)
    payload = json.loads(event.payload)
    assert payload == {
        "order_id": "o-1",
        "card": "[redacted]",  # SecretStr, declared or not
        "billing": {"name": "Holder-Zed", "iban": "[redacted]"},  # Sensitive, nested
        "detail": {"holder": "[redacted]", "note": "ok"},  # the declared name, nested
        "holder": "[redacted]",
    }


async def test_a_repeated_start_with_the_same_secret_input_is_the_same_instance(
    journal: tuple[str, Callable[[], Any], Callable[[], bytes]], hosts: Callable[..., Any]
) -> None:
    _, store, _ = journal
    host = await hosts(store())
    first = await host.start("pay.card", _payment("o-9"), idempotency_key="k-9")
    again = await host.start("pay.card", _payment("o-9"), idempotency_key="k-9")
    assert again.instance_id == first.instance_id and not again.created
    other = _payment("o-9").model_copy(update={"card": SecretStr("4000-0000-0000-0002")})
    with pytest.raises(flowx.IdempotencyConflict):
        await host.start("pay.card", other, idempotency_key="k-9")


def test_a_flow_with_sensitive_members_is_refused_on_a_host_without_keys(tmp_path: Path) -> None:
    with pytest.raises(flowx.PlanError, match="FLOWX1028") as refused:
        flowx.FlowHost(store=flowx.sqlite(tmp_path / "j.db"), flows=[secret_flows.pay])
    assert "input (Payment)" in str(refused.value) and "signal 'otp'" in str(refused.value)


async def test_rotate_check_counts_what_each_key_seals(
    journal: tuple[str, Callable[[], Any], Callable[[], bytes]], hosts: Callable[..., Any]
) -> None:
    url, store, _ = journal
    secret_flows.FAILED_ONCE.clear()
    await _pay_across_two_nodes(hosts, store)
    runner = CliRunner()
    new = runner.invoke(cli, ["keys", "generate", "--id", "k2"]).output.strip()
    assert flowx.Keyring.parse(new).current == "k2"

    async def check(keys: str) -> tuple[int, dict[str, Any]]:
        args = ["keys", "rotate-check", "--db", url, "-o", "json"]
        env = {"FLOWX_ENCRYPTION_KEYS": keys}
        done = await asyncio.to_thread(runner.invoke, cli, args, env=env)
        return done.exit_code, json.loads(done.output)

    code, now = await check(KEYS)
    (k1,) = now["keys"]
    assert code == 0 and k1["key"] == "k1" and k1["status"] == "current"
    assert k1["sealed_members"] >= 4
    code, rotated = await check(f"{new},{KEYS}")
    statuses = {k["key"]: (k["status"], k["sealed_members"]) for k in rotated["keys"]}
    assert code == 0
    assert statuses == {"k2": ("current", 0), "k1": ("old: still needed", k1["sealed_members"])}
    code, dropped = await check(new)
    assert code == 1 and dropped["unreadable"] == ["k1"]


async def test_a_signal_bound_for_a_sealed_field_is_sealed_in_the_inbox_and_in_its_row(
    journal: tuple[str, Callable[[], Any], Callable[[], bytes]], hosts: Callable[..., Any]
) -> None:
    """The payload's type declares nothing sensitive; the state field it goes into does."""
    _, store, dump = journal
    host = await hosts(store())
    handle = await host.start("pay.approve", _payment("o-9"))
    await host.wait_idle(timeout=10)
    note = json.dumps({"note": f"note-{CANARY}"})
    assert (await host.signal(handle.instance_id, "approve", note)).status == "woken"
    state = await handle.result(timeout=10)
    assert state.approval is not None and state.approval.note == f"note-{CANARY}"
    await host.wait_idle(timeout=5)
    stored = dump()
    assert f"note-{CANARY}".encode() not in stored and stored.count(MARK.encode()) >= 3


async def test_what_a_for_each_collects_into_a_sealed_field_is_sealed_in_every_row(
    journal: tuple[str, Callable[[], Any], Callable[[], bytes]], hosts: Callable[..., Any]
) -> None:
    """R9.8: the body's steps and its wait have no ``into`` of their own; their values reach
    a sealed field only through the for_each that collects them (through a fork and a nested
    for_each too). Their rows, and the awaited signal in the inbox, are sealed all the same."""
    _, store, dump = journal
    host = await hosts(store())
    handle = await host.start("pay.collect", _payment("o-12"))
    await host.wait_idle(timeout=10)
    note = json.dumps({"note": f"note-{CANARY}"})
    assert (await host.signal(handle.instance_id, "part_ok", note)).status == "woken"
    state = await handle.result(timeout=10)
    a, b, t = f"part-a-{CANARY}", f"part-b-{CANARY}", f"part-t-{CANARY}"
    assert state.references == [[a, [a]], [b, [b]]]
    assert [x.note for x in state.approvals] == [f"note-{CANARY}"]
    assert [x.get_secret_value() for x in state.tokens] == [t]
    await host.wait_idle(timeout=5)
    stored = dump()
    for secret in (a, b, t, f"note-{CANARY}"):
        assert secret.encode() not in stored, secret
    rows = await host.store.journal.steps(handle.instance_id)
    collected = [r for r in rows if r.step_name in ("left", "right", "part_ok", "token")]
    names = sorted(r.step_name for r in collected)
    assert names == ["left", "left", "part_ok", "right", "right", "token"]
    assert all(MARK in r.result for r in collected), [(r.step_name, r.result) for r in collected]
    # The wait's row seals the payload alone: which signal it took stays readable.
    wait = next(r for r in collected if r.step_name == "part_ok")
    assert isinstance(json.loads(wait.result)["seq"], int)


async def test_flowx_signal_says_what_is_wrong_with_a_payload_bound_for_a_sealed_field(
    tmp_path: Path, hosts: Callable[..., Any]
) -> None:
    """The CLI checks a refused payload as the host would store it, sealed: not as a payload
    that "has no encryption keys" on a node that has them."""
    path = tmp_path / "j.db"
    host = await hosts(flowx.sqlite(path))
    handle = await host.start("pay.approve", _payment("o-11"))
    await host.wait_idle(timeout=10)
    args = [
        "signal", handle.instance_id, "approve", "--payload", '{"nope": 1}',
        "--db", f"sqlite:///{path}", "--flows", "tests.secrets.secret_flows:FLOWS",
    ]  # fmt: skip
    env = {"FLOWX_ENCRYPTION_KEYS": KEYS}
    done = await asyncio.to_thread(CliRunner().invoke, cli, args, env=env)
    assert done.exit_code == 2, done.output
    assert "pass --payload as a JSON object of that shape" in done.output
    assert "encryption keys" not in done.output


async def test_two_waits_on_one_signal_bound_for_sealed_fields_take_one_signal_each(
    journal: tuple[str, Callable[[], Any], Callable[[], bytes]], hosts: Callable[..., Any]
) -> None:
    _, store, dump = journal
    host = await hosts(store())
    handle = await host.start("pay.approve_twice", _payment("o-10"))
    for note in ("first", "second"):
        await host.wait_idle(timeout=10)
        payload = json.dumps({"note": f"{note}-{CANARY}"})
        assert (await host.signal(handle.instance_id, "approve", payload)).status == "woken"
    state = await handle.result(timeout=10)
    assert state.first is not None and state.first.note == f"first-{CANARY}"
    assert state.second is not None and state.second.note == f"second-{CANARY}"
    await host.wait_idle(timeout=5)
    stored = dump()
    assert f"first-{CANARY}".encode() not in stored
    assert f"second-{CANARY}".encode() not in stored


async def test_a_sub_flow_child_gets_the_secret_and_returns_one(
    journal: tuple[str, Callable[[], Any], Callable[[], bytes]], hosts: Callable[..., Any]
) -> None:
    _, store, dump = journal
    secret_flows.SEEN.clear()
    host = await hosts(store())
    state = await (await host.start("pay.checkout", _payment("o-5"))).result()
    assert secret_flows.SEEN["card"] == CANARY  # in the child, sealed under its own id
    assert state.child.token.get_secret_value() == f"tok-{CANARY}"
    await host.wait_idle(timeout=5)
    stored = dump()
    assert CANARY.encode() not in stored and stored.count(MARK.encode()) >= 4


async def test_the_api_and_the_ui_show_sealed_members_masked(
    tmp_path: Path, hosts: Callable[..., Any]
) -> None:
    import httpx

    from flowx.api import create_app

    secret_flows.FAILED_ONCE.clear()
    instance_id, second = await _pay_across_two_nodes(
        hosts, lambda: flowx.sqlite(tmp_path / "j.db")
    )
    transport = httpx.ASGITransport(app=create_app(second))
    async with httpx.AsyncClient(transport=transport, base_url="http://flowx.test") as client:
        pages = [
            await client.get(f"/v1/instances/{instance_id}"),
            await client.get(f"/v1/instances/{instance_id}/steps"),
            await client.get(f"/v1/instances/{instance_id}/result"),
            await client.get(f"/ui/instances/{instance_id}"),
        ]
    for page in pages:
        assert page.status_code == 200, page.text
        for secret in SECRETS:
            assert secret not in page.text, f"{secret!r} shown by {page.request.url}"
    assert "**********" in pages[0].text and "**********" in pages[2].text
