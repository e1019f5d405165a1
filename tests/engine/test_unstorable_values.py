"""A value the journal cannot store fails its own step, start or signal, cleanly (SPEC R9.5).

Written against the ``memory_store`` fixture, which would store anything; the same tests run
on a real SQLite file and a real PostgreSQL schema in
``tests/hosting/test_constructs_on_stores.py``, where a lone surrogate that reached the driver
would fail the commit and leave the step to be re-run by recovery.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr

import flowx
from flowx import codec
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceState, Outcome
from tests.engine.kit import Ledger, Order, failure_of, reservation, rows_of
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse

ledger = Ledger("unst")
calls = ledger.calls
#: What the ``unst.produce`` capability returns in the running test.
produced: list[Callable[[], Any]] = ledger.also_clears([])


class Reading(BaseModel):
    value: float
    label: str = ""


class OrderState(BaseModel):
    reservation: str | None = None
    produced: Any = None
    ratio: float | None = None
    reading: Reading | None = None


reserve = ledger.capability("reserve", returns=reservation)
release = ledger.undo("release")
produce = ledger.capability("produce", returns=lambda _: produced[0]())


@flowx.capability("unst.read", version="1.0.0")
async def read(ctx: flowx.StepContext, reading: Reading) -> str:
    calls["read"] += 1
    return reading.label


@flowx.event("unst.noted", version="1")
class Noted(BaseModel):
    order_id: str
    note: str


RETRY = flowx.Retry(attempts=3, backoff="none")


def saga(into: str | None = "produced") -> flowx.Plan:
    return (
        flowx.flow("unst.saga", version="1", input=Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release)
        .step(produce, into=into, retry=RETRY)
        .build()
    )


async def instances(host: flowx.FlowHost) -> list[Any]:
    assert host.store is not None
    return list(await host.store.catalog.list_instances(InstanceQuery()))


async def failed_once(host: flowx.FlowHost, plan: flowx.Plan, step_id: int = 2) -> dict[str, Any]:
    """Run ``plan`` to its end; it must fail at ``step_id`` with exactly one attempt row, a
    storable Failure whose payload names the field, and compensate what ran before it."""
    handle = await host.start(plan, Order(order_id="o1"))
    failed = await failure_of(handle, timeout=10)
    assert failed.state == "Failed"
    rows = await rows_of(host, handle.instance_id)
    attempts = [r for r in rows if r.step_id == step_id]
    assert [(r.attempt, r.outcome) for r in attempts] == [(1, Outcome.FAILURE)]
    stored = codec.loads(attempts[0].result)
    assert stored["retryable"] is False
    assert stored["code"] == failed.error["code"]
    assert stored.get("field") == failed.error.get("field")
    assert calls["release"] == 1  # the step before it was compensated, once
    return dict(failed.error)


# -- step results ----------------------------------------------------------------------------


class Login(BaseModel):
    user: str
    extra: Any = None


async def test_a_step_returning_a_secret_no_type_declares_fails_once_instead_of_losing_it(
    host_factory: Any, clock: Any
) -> None:
    """R9.5, R9.8: a ``SecretStr`` in a part of a result no declared type covers would be
    stored as pydantic's mask, the token lost; the step fails once instead, naming where it
    is and what to declare, and its row and error never hold the secret."""
    produced.append(lambda: Login(user="ada", extra={"token": SecretStr("tok-4929-7731")}))
    plan = saga()
    host = await host_factory(plan)
    error = await failed_once(host, plan)
    assert error["code"] == "step.result_unstorable"
    assert error["field"] == "result.extra.token"
    assert "'**********'" in error["message"] and "declare its type" in error["message"]
    assert "tok-4929-7731" not in str(error)


async def test_a_step_returning_a_lone_surrogate_fails_once_and_is_not_re_run(
    host_factory: Any, clock: Any
) -> None:
    """R9.5: a result with a lone surrogate fails its own step, non-retryably (one attempt
    row though the step may retry), naming the field; the flow compensates and ends Failed,
    and a recovery sweep on another node, a TTL later, re-runs nothing."""
    produced.append(lambda: {"items": [{"name": "ok"}, {"name": "bad \ud800"}]})
    plan = saga()
    host = await host_factory(plan)
    error = await failed_once(host, plan)
    assert error["code"] == "step.result_unstorable"
    assert error["field"] == "result.items[1].name"
    assert (
        "lone surrogate '\\ud800'" in error["message"] and "unst.produce@1.0.0" in error["message"]
    )
    assert calls["produce"] == 1
    (record,) = await instances(host)
    assert record.state is InstanceState.FAILED
    steps_before = len(await rows_of(host, record.instance_id))

    other = await host_factory(plan)
    clock.advance(other.settings.lease_ttl * 3)
    await other.recover_once()
    await other.wait_idle(timeout=5)
    assert (calls["produce"], calls["release"]) == (1, 1)
    assert len(await rows_of(other, record.instance_id)) == steps_before
    assert (await other.get(record.instance_id)).state is InstanceState.FAILED


def _generator() -> Any:
    return {"lines": (n for n in range(3))}


@pytest.mark.parametrize(
    ("value", "field", "says"),
    [
        (lambda: {"by_key": {"k\udcff": 1}}, "result.by_key", "lone surrogate '\\udcff'"),
        (lambda: [1.0, float("nan")], "result[1]", "NaN and Infinity have no JSON form"),
        (lambda: {"total": float("inf")}, "result.total", "NaN and Infinity"),
        (lambda: {"tags": {"b", "a"}}, "result.tags", "a set has no order"),
        (_generator, "result.lines", "storing it would consume it"),
        (lambda: {"blob": b"\x00\x01"}, "result.blob", "JSON has no bytes"),
        (lambda: {"counts": {1: "one"}}, "result.counts", "would be stored as '1'"),
        (lambda: object(), "result", "has no JSON form"),
    ],
    ids=["key-surrogate", "nan", "infinity", "set", "generator", "bytes", "int-key", "object"],
)
async def test_a_result_that_cannot_be_stored_as_is_fails_its_step_naming_the_field(
    host_factory: Any, value: Callable[[], Any], field: str, says: str
) -> None:
    """R9.5: never a quiet conversion either: a set, a generator, bytes or a non-str key
    would be stored changed, so each is refused like a value with no JSON form."""
    produced.append(value)
    plan = saga()
    host = await host_factory(plan)
    error = await failed_once(host, plan)
    assert error["code"] == "step.result_unstorable"
    assert error["field"] == field
    assert says in error["message"]
    assert calls["produce"] == 1


async def test_a_result_that_makes_the_state_unstorable_fails_its_step(host_factory: Any) -> None:
    """R9.5: the string "nan" is storable, but validated into a float field it becomes NaN:
    the state snapshot cannot be stored, so the step fails (not its commit)."""
    produced.append(lambda: "nan")
    plan = saga(into="ratio")
    host = await host_factory(plan)
    error = await failed_once(host, plan)
    assert error["code"] == "step.result_unstorable"
    assert error["field"] == "state.ratio"
    assert calls["produce"] == 1


async def test_declared_types_and_a_nul_character_are_stored_exactly(host_factory: Any) -> None:
    """R9.5: what the journal can store is stored unchanged: a NUL in a string goes in as the
    JSON escape ``\\u0000`` (PostgreSQL's ``json`` keeps it; only ``jsonb`` would refuse it),
    a tuple as an array, a model through its declared serialiser."""
    value = {"text": "a\x00b", "pair": (1, 2), "reading": Reading(value=1.5, label="é")}
    produced.append(lambda: value)
    plan = saga()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o1"))
    state = await handle.result(timeout=10)
    assert state.produced == {
        "text": "a\x00b",
        "pair": [1, 2],
        "reading": {"value": 1.5, "label": "é"},
    }
    (row,) = [r for r in await rows_of(host, handle.instance_id) if r.step_id == 2]
    assert row.result == '{"pair":[1,2],"reading":{"label":"é","value":1.5},"text":"a\\u0000b"}'


# -- emit and sub_flow -----------------------------------------------------------------------


async def test_an_event_that_cannot_be_stored_fails_its_emit_step(host_factory: Any) -> None:
    """R9.5: an emit's payload is checked before its commit; the outbox stays empty."""
    plan = (
        flowx.flow("unst.emit", version="1", input=Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release)
        .emit(Noted, lambda o, s: Noted(order_id=o.order_id, note="\ud83d alone"))
        .build()
    )
    host = await host_factory(plan)
    error = await failed_once(host, plan)
    assert error["code"] == "emit.payload_unstorable"
    assert error["field"] == "event.note"
    assert host.store is not None
    (record,) = await instances(host)
    assert list(await host.store.journal.events(record.instance_id)) == []


async def test_a_sub_flow_input_that_cannot_be_stored_fails_the_step_and_starts_no_child(
    host_factory: Any,
) -> None:
    """R9.5: the child's input is checked before its row is written."""
    child = (
        flowx.flow("unst.child", version="1", input=Reading, state=OrderState).step(read).build()
    )
    plan = (
        flowx.flow("unst.parent", version="1", input=Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release)
        .sub_flow(child, lambda o, s: Reading(value=float("nan")), into="produced")
        .build()
    )
    host = await host_factory(plan, child)
    error = await failed_once(host, plan)
    assert error["code"] == "sub_flow.input_invalid"
    assert "input.value is nan" in error["message"]
    assert [r.flow_id for r in await instances(host)] == ["unst.parent"]
    assert calls["read"] == 0


# -- starts and signals ----------------------------------------------------------------------


def reading_flow() -> flowx.Plan:
    return (
        flowx.flow("unst.reading", version="1", input=Reading, state=OrderState)
        .await_signal("reading", Reading, into="reading")
        .build()
    )


@pytest.mark.parametrize(
    ("value", "kw", "field"),
    [
        (Reading(value=1.0, label="\ud800"), {}, "input.label"),
        ({"value": float("nan")}, {}, "input.value"),
        (Reading(value=1.0), {"idempotency_key": "key-\udc80"}, "idempotency_key"),
        (Reading(value=1.0), {"idempotency_key": "key-\x00"}, "idempotency_key"),
        (Reading(value=1.0), {"correlation_id": "\udfff"}, "correlation_id"),
    ],
    ids=["surrogate", "nan", "key-surrogate", "key-nul", "correlation-surrogate"],
)
async def test_a_start_that_cannot_be_stored_is_refused_and_writes_nothing(
    host_factory: Any, value: Any, kw: dict[str, Any], field: str
) -> None:
    """R9.5: refused with a FlowX error naming the field, before any row or lease."""
    plan = reading_flow()
    host = await host_factory(plan)
    with pytest.raises(flowx.SerialisationError) as refused:
        await host.start(plan, value, **kw)
    assert refused.value.code == "flow.input_unstorable"
    assert refused.value.path == field
    assert str(refused.value).startswith(f"the start of unst.reading@1 cannot be stored: {field}")
    assert await instances(host) == []


@pytest.mark.parametrize(
    ("payload", "key", "field"),
    [
        (Reading(value=2.0, label="\ud800"), None, "payload.label"),
        ({"value": float("nan")}, None, "payload.value"),
        ('{"value": NaN}', None, "payload.value"),
        (Reading(value=2.0), "hook-\udcff", "key"),
    ],
    ids=["surrogate", "nan", "nan-json-text", "key-surrogate"],
)
async def test_a_signal_that_cannot_be_stored_is_refused_and_keeps_nothing(
    host_factory: Any, payload: Any, key: str | None, field: str
) -> None:
    """R9.5: the instance stays parked, its inbox empty; a good signal still wakes it."""
    plan = reading_flow()
    host = await host_factory(plan)
    handle = await host.start(plan, Reading(value=1.0))
    await host.wait_idle(timeout=5)
    assert (await host.get(handle.instance_id)).state is InstanceState.SUSPENDED
    with pytest.raises(flowx.SerialisationError) as refused:
        await host.signal(handle.instance_id, "reading", payload, key=key)
    assert refused.value.code == "signal.payload_unstorable"
    assert refused.value.path == field
    assert host.store is not None
    assert list(await host.store.waits.signals(handle.instance_id, "reading")) == []
    assert (await host.get(handle.instance_id)).state is InstanceState.SUSPENDED
    receipt = await host.signal(handle.instance_id, "reading", Reading(value=3.0, label="ok"))
    assert receipt.status == "woken"
    state = await handle.result(timeout=10)
    assert state.reading == Reading(value=3.0, label="ok")
