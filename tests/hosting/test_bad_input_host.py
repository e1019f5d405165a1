"""``host.start`` / ``host.signal`` given bad input (issue 12 item 11): a FlowX error, nothing
written, and the journal still runs flows. A real SQLite journal."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import flowx
from flowx.stores.protocols import InstanceQuery
from tests.fuzz.support import FLOWS, FuzzIn, echo, wait


@pytest.fixture
def host(tmp_path: Path) -> AsyncIterator[flowx.FlowHost]:
    async def opened() -> flowx.FlowHost:
        h = flowx.FlowHost(
            store=flowx.sqlite(tmp_path / "j.db"),
            flows=FLOWS,
            settings=flowx.HostSettings.load(recovery=False, timers=False),
        )
        await h.__aenter__()
        return h

    loop = asyncio.new_event_loop()
    h = loop.run_until_complete(opened())
    h._test_loop = loop  # type: ignore[attr-defined]
    yield h
    loop.run_until_complete(h.__aexit__(None, None, None))
    loop.close()


def run(host: flowx.FlowHost, coro: Any) -> Any:
    return host._test_loop.run_until_complete(coro)  # type: ignore[attr-defined]


def count(host: flowx.FlowHost) -> int:
    assert host.store is not None
    return len(run(host, host.store.catalog.list_instances(InstanceQuery())))


def still_runs(host: flowx.FlowHost) -> None:
    handle = run(host, host.start(echo, FuzzIn(value=[1], label="after")))
    assert run(host, handle.result(timeout=20)).result == [1]


def test_a_partition_key_that_raises_is_invalid_input(host: flowx.FlowHost) -> None:
    with pytest.raises(flowx.InputInvalid, match="partition_key raised RuntimeError"):
        run(host, host.start(echo, FuzzIn(label="boom")))
    assert count(host) == 0
    still_runs(host)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"idempotency_key": 7}, "idempotency_key must be a str, not int"),
        ({"idempotency_key": "k\x00"}, "NUL character"),
        ({"correlation_id": b"c"}, "correlation_id must be a str, not bytes"),
        ({"idempotency_key": "k\ud800"}, "lone surrogate"),
    ],
)
def test_a_key_that_cannot_be_stored_is_refused(
    host: flowx.FlowHost, kwargs: dict[str, Any], says: str
) -> None:
    with pytest.raises(flowx.SerialisationError, match=says) as caught:
        run(host, host.start(echo, FuzzIn(), **kwargs))
    assert caught.value.code == "flow.input_unstorable"
    assert count(host) == 0
    still_runs(host)


@pytest.mark.parametrize("value", [float("nan"), b"raw", {1, 2}, {1: "a"}, "x\udfff"])
def test_an_input_typed_any_that_would_change_is_refused(host: flowx.FlowHost, value: Any) -> None:
    with pytest.raises(flowx.SerialisationError) as caught:
        run(host, host.start(echo, {"value": value}))
    assert caught.value.code == "flow.input_unstorable" and caught.value.path == "input.value"
    assert count(host) == 0


@pytest.mark.parametrize("instance_id", ["i\ud800", "i\x00", 42, None])
def test_an_id_no_journal_could_hold_is_not_found(host: flowx.FlowHost, instance_id: Any) -> None:
    with pytest.raises(flowx.InstanceNotFound):
        run(host, host.get(instance_id))
    with pytest.raises(flowx.InstanceNotFound):
        run(host, host.signal(instance_id, "go", {}))


def test_a_signal_payload_that_cannot_be_stored_keeps_nothing(host: flowx.FlowHost) -> None:
    iid = run(host, host.start(wait, FuzzIn(), run_here=False)).instance_id
    for payload, key in ((float("nan"), None), ({"b": b"x"}, None), ({}, 5), ({}, "k\ud800")):
        with pytest.raises(flowx.SerialisationError) as caught:
            run(host, host.signal(iid, "go", payload, key=key, run_here=False))
        assert caught.value.code == "signal.payload_unstorable"
    assert host.store is not None
    assert list(run(host, host.store.waits.signals(iid, "go"))) == []
    receipt = run(host, host.signal(iid, "go", {"ok": 1}, run_here=False))
    assert receipt.status == "kept"  # Pending, not yet at its wait: kept for it
    assert len(run(host, host.store.waits.signals(iid, "go"))) == 1
