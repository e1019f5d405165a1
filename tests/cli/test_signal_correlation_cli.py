"""`flowx signal --correlation ID NAME` (issue 18 item 2; R2.10): the instance named by the
correlation id it was started with, by the rule of ``flowx.hosting.correlation``, on a real
SQLite file through click's runner."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from flowx.stores.records import InstanceState
from tests.cli import wait_flows
from tests.cli.test_signal_replay_cli import SHIPPED, flowx_, host, record_of
from tests.cli.wait_flows import Order


@pytest.fixture
def db(db: str, faults: Path) -> str:
    """The shared journal, with the fault switches of ``wait_flows`` set."""
    return db


def suspended_with(db: str, order_id: str, correlation: str) -> str:
    """Start a ``shipping`` instance carrying ``correlation`` and run it to its wait."""

    async def main() -> str:
        async with host(db) as h:
            handle = await h.start(
                wait_flows.shipping, Order(order_id=order_id), correlation_id=correlation
            )
            await h.wait_idle(timeout=10)
            return handle.instance_id

    iid = asyncio.run(main())
    assert record_of(db, iid).state is InstanceState.SUSPENDED
    return iid


def test_a_signal_by_correlation_wakes_the_one_instance_carrying_it(db: str) -> None:
    iid = suspended_with(db, "s1", "po-1")
    suspended_with(db, "s2", "po-2")
    args = ("--correlation", "po-1", "shipped", "--payload", SHIPPED, "--key", "k", "-o", "json")
    code, out, err = flowx_(db, "signal", *args)
    assert code == 0, err
    receipt = json.loads(out)
    assert (receipt["instance_id"], receipt["status"]) == (iid, "woken"), receipt
    assert record_of(db, iid).state is InstanceState.PENDING
    again = flowx_(db, "signal", *args)
    assert again[0] == 0 and json.loads(again[1])["status"] == "duplicate"


def test_an_unknown_correlation_exits_3_and_an_ambiguous_one_exits_2(db: str) -> None:
    code, _, err = flowx_(db, "signal", "--correlation", "po-none", "shipped")
    assert code == 3 and "no flow instance has correlation id 'po-none'" in err, err
    for order_id in ("a1", "a2"):
        suspended_with(db, order_id, "po-9")
    code, _, err = flowx_(db, "signal", "--correlation", "po-9", "shipped", "--payload", SHIPPED)
    assert code == 2 and "names 2 flow instances that have not ended" in err, err


def test_correlation_with_an_instance_id_too_or_no_name_is_a_usage_error(db: str) -> None:
    iid = suspended_with(db, "u1", "po-3")
    code, _, err = flowx_(db, "signal", iid, "shipped", "--correlation", "po-3")
    assert code == 2 and "give only the signal NAME" in err, err
    code, _, err = flowx_(db, "signal", iid)
    assert code == 2 and "give INSTANCE_ID and NAME" in err, err
    assert record_of(db, iid).state is InstanceState.SUSPENDED
