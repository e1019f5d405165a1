"""``flowx show`` in text: the step timeline names the node of every attempt, and the events an
instance staged are listed with their key and whether they left (issue 15 item 4)."""

from __future__ import annotations

import asyncio
import json

import flowx
from tests.cli.runner import invoke
from tests.outbox.flows import Order, order_flow


def _run_here(db: str) -> tuple[str, str]:
    """Run one order to its end on an in-process node; its instance id and that node's id."""

    async def main() -> tuple[str, str]:
        async with flowx.FlowHost(
            store=flowx.sqlite(db.removeprefix("sqlite:///")),
            flows=[order_flow],
            settings=flowx.HostSettings.load(recovery=False, node_id="node-east-1"),
        ) as host:
            handle = await host.start(order_flow, Order(order_id="o-7"))
            await handle.result(timeout=10)
            return handle.instance_id, host.node_id

    return asyncio.run(main())


def test_show_names_the_node_of_each_step_and_lists_the_staged_events(db: str) -> None:
    iid, node = _run_here(db)
    assert node == "node-east-1"
    code, out, err = invoke("show", iid, "--db", db, "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert [s["node_id"] for s in doc["steps"]] == [node] * 4
    assert [(e["partition_key"], e["published_at"]) for e in doc["events"]] == [("o-7", None)] * 3

    code, out, err = invoke("show", iid, "--db", db)
    assert code == 0, err
    timeline, events = out.split("\nevents\n", 1)
    table = timeline.split("\n\n", 1)[1].splitlines()
    header = table[0].split()
    assert header[header.index("committed_at") + 1] == "node"
    nodes = [row.split()[header.index("node")] for row in table[2:]]
    assert nodes == [node] * 4
    rows = events.splitlines()
    assert rows[0].split() == ["event", "type", "key", "published_at", "attempts"]
    assert [r.split()[1:5] for r in rows[2:]] == [["shop.order_event", "o-7", "pending", "0"]] * 3


def test_describe_is_show_under_the_name_temporal_users_type(db: str) -> None:
    iid, _ = _run_here(db)
    shown = invoke("show", iid, "--db", db, "-o", "json")
    described = invoke("describe", iid, "--db", db, "-o", "json")
    assert described[0] == 0, described[2]
    assert json.loads(described[1]) == json.loads(shown[1])
    code, out, _ = invoke("describe", "--help")
    assert code == 0 and "The same as `flowx show`" in out
