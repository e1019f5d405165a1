"""`flowx start` and `flowx signal` with a value the journal cannot store (SPEC R9.5): a clear
one-line error, no traceback, and nothing written. Run in-process on a real SQLite file."""

from __future__ import annotations

import asyncio

import pytest

import flowx
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceRecord, InstanceState
from tests.cli.runner import invoke
from tests.cli.unstorable_flows import FLOWS, Reading

FLOWS_REF = "tests.cli.unstorable_flows:FLOWS"


def flowx_(db: str, *args: str) -> tuple[int, str, str]:
    return invoke(*args, "--db", db, "--flows", FLOWS_REF)


def host(db: str) -> flowx.FlowHost:
    path = db.removeprefix("sqlite:///")
    return flowx.FlowHost(
        store=flowx.sqlite(path),
        flows=FLOWS,
        settings=flowx.HostSettings.load(recovery=False, timers=False),
    )


def instances(db: str) -> list[InstanceRecord]:
    async def main() -> list[InstanceRecord]:
        async with host(db) as h:
            assert h.store is not None
            return list(await h.store.catalog.list_instances(InstanceQuery()))

    return asyncio.run(main())


def waiting(db: str) -> str:
    """An instance Suspended at its wait for ``reading``."""

    async def main() -> str:
        async with host(db) as h:
            handle = await h.start(FLOWS[0], Reading(value=1.0))
            await h.wait_idle(timeout=10)
            assert (await h.get(handle.instance_id)).state is InstanceState.SUSPENDED
            return handle.instance_id

    return asyncio.run(main())


def inbox(db: str, iid: str) -> list[object]:
    async def main() -> list[object]:
        async with host(db) as h:
            assert h.store is not None
            return list(await h.store.waits.signals(iid, "reading"))

    return asyncio.run(main())


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--input", '{"value": NaN}'), "input.value is nan: NaN and Infinity have no JSON"),
    ],
    ids=["nan"],
)
def test_start_with_a_value_that_cannot_be_stored_is_a_usage_error(
    db: str, args: tuple[str, ...], says: str
) -> None:
    """R9.5: exit 2 with the field named, and no instance written."""
    code, out, err = flowx_(db, "start", "cli.reading", *args)
    assert code == 2, err
    assert out == ""
    assert err.startswith("error: the start of cli.reading@1.0.0 cannot be stored: ")
    assert says in err and "Traceback" not in err
    assert instances(db) == []


def test_start_with_a_lone_surrogate_in_the_input_is_refused_and_writes_nothing(db: str) -> None:
    """R9.5: a lone surrogate in ``--input`` (a \\u escape) is refused as unstorable, naming
    the field (exit 2), before pydantic's JSON parser could call it malformed JSON."""
    code, _, err = flowx_(db, "start", "cli.reading", "--input", '{"value": 1, "label": "\\ud800"}')
    assert code == 2, err
    assert err.startswith("error: the start of cli.reading@1.0.0 cannot be stored: input.label")
    assert "Traceback" not in err
    assert instances(db) == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--payload", '{"value": NaN}'), "cannot be stored: payload.value is nan"),
        (("--payload", '{"value": 2, "label": "\\ud800"}'), "payload.label holds a lone"),
    ],
    ids=["nan", "surrogate"],
)
def test_signal_with_a_value_that_cannot_be_stored_is_a_usage_error(
    db: str, args: tuple[str, ...], says: str
) -> None:
    """R9.5: exit 2, the instance still waiting and its inbox empty; a good signal still
    wakes it afterwards."""
    iid = waiting(db)
    code, out, err = flowx_(db, "signal", iid, "reading", *args)
    assert code == 2, err
    assert out == ""
    assert err.startswith("error: signal 'reading' for cli.reading@1.0.0 ")
    assert says in err and "Traceback" not in err
    assert inbox(db, iid) == []
    (record,) = instances(db)
    assert record.state is InstanceState.SUSPENDED
    code, out, err = flowx_(db, "signal", iid, "reading", "--payload", '{"value": 2}')
    assert code == 0, err
    assert out.startswith("woken:")
