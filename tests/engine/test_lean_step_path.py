"""What the trimmed step path (issue 14) must still do as before: the live run goes on with
the value a replay reads back from the row (R2.5), and the run's result is the state the
journal holds at its end."""

from __future__ import annotations

import contextlib
from typing import Any

from pydantic import BaseModel

import flowx
from flowx import codec
from tests.engine import kit
from tests.engine.kit import rows_of

MARKED = '{"$flowx.sealed": "a document a capability read, returned verbatim"}'


class Noted(BaseModel):
    note: str | None = None
    seen: list[str] = []


@flowx.capability("lean.echo", version="1.0.0")
async def echo(ctx: flowx.StepContext, order: kit.Order) -> str:
    return MARKED


@flowx.capability("lean.plain", version="1.0.0")
async def plain(ctx: flowx.StepContext, order: kit.Order) -> str:
    return "a"


@flowx.capability("lean.each", version="1.0.0")
async def each(ctx: flowx.StepContext, n: int) -> str:
    return "b"


async def test_a_text_result_holding_the_sealing_mark_is_read_back_as_a_replay_reads_it(
    host_factory: Any,
) -> None:
    """A ``str`` result is not decoded again after encoding (JSON gives it back as it is),
    except one holding the sealing mark's text: decoding it without keys refuses it, as a
    replay of the row would. Skipped, the live run committed a success no node could ever
    replay."""
    plan = (
        flowx.flow("lean.mark", version="1", input=kit.Order, state=Noted)
        .step(echo, into="note")
        .build()
    )
    host = await host_factory(plan)
    handle = await host.start(plan, kit.Order(order_id="m1"))
    with contextlib.suppress(flowx.FlowFailed):
        await handle.result()
    (first, *_) = await rows_of(host, handle.instance_id)
    assert first.outcome is flowx.Outcome.FAILURE
    assert codec.loads(first.result)["code"] == "keys.missing"


def counted(order: kit.Order, state: Noted) -> list[int]:
    state.seen.append("counted")  # a selector that changes the state it is handed, in place
    return [1]


async def test_the_result_is_the_state_the_instance_ended_with(host_factory: Any) -> None:
    """The run's result reuses the encoding of its last write: the transition that ends
    the instance is that write, so a state changed in place after the last step's commit
    is in both the stored row and the result."""
    plan = (
        flowx.flow("lean.inplace", version="1", input=kit.Order, state=Noted)
        .step(plain, into="note")
        .for_each("each", counted, lambda body: body.step(each))
        .build()
    )
    host = await host_factory(plan)
    handle = await host.start(plan, kit.Order(order_id="i1"))
    here = await handle.result()  # this node's RunResult
    stored = codec.loads((await host.get(handle.instance_id)).state_bag)
    assert here.model_dump() == stored == {"note": "a", "seen": ["counted"]}
