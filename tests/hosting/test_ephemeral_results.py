"""Ephemeral results on a long-lived host (issue 13): kept for ``host.handle(id).result()``
only up to ``ephemeral_results_kept``, oldest first out, so a worker that runs Ephemeral flows
for days does not grow; the handle ``start`` returned keeps its own result regardless."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

import flowx
from flowx.errors import FlowFailed


class Quote(BaseModel):
    amount: int


class QuoteState(BaseModel):
    total: int | None = None


@flowx.capability("ephres.price", version="1.0.0")
async def price(ctx: flowx.StepContext, quote: Quote) -> int:
    if quote.amount < 0:
        raise flowx.NonRetryableError("a negative amount has no price")
    return quote.amount * 2


QUOTE = (
    flowx.flow(
        "ephres.quote", version="1.0.0", input=Quote, state=QuoteState, profile=flowx.Ephemeral
    )
    .step(price, into="total")
    .build()
)


async def test_a_long_lived_host_keeps_at_most_the_cap_of_ephemeral_results() -> None:
    settings = flowx.HostSettings(ephemeral_results_kept=5)
    async with flowx.FlowHost(flows=[QUOTE], settings=settings) as host:
        handles = [await host.start(QUOTE, {"amount": n}) for n in range(40)]
        assert host._runner.ephemeral_kept == 5
        # Every start's own handle still has its result, kept or not by the host.
        for n, handle in enumerate(handles):
            assert (await handle.result(timeout=5)).total == n * 2
        # The newest are still found by id; the host kept no more than the cap.
        latest = host.handle(handles[-1].instance_id, QUOTE)
        assert (await latest.result(timeout=5)).total == 39 * 2
        assert host._runner.ephemeral_kept == 5


async def test_a_failed_ephemeral_run_still_raises_from_its_handle() -> None:
    async with flowx.FlowHost(
        flows=[QUOTE], settings=flowx.HostSettings(ephemeral_results_kept=1)
    ) as host:
        failed = await host.start(QUOTE, {"amount": -1})
        await host.start(QUOTE, {"amount": 1})  # pushes the failed one out of the host
        with pytest.raises(FlowFailed):
            await failed.result(timeout=5)


def test_the_cap_is_a_validated_setting() -> None:
    with pytest.raises(flowx.SettingsError, match="ephemeral_results_kept"):
        flowx.HostSettings.load(ephemeral_results_kept=0)
