"""A flow for the CLI tests of values the journal cannot store (``--flows
tests.cli.unstorable_flows:FLOWS``): its input and its signal carry a float, so NaN is valid
JSON for pydantic and only the codec can refuse it (SPEC R9.5)."""

from __future__ import annotations

from pydantic import BaseModel

import flowx


class Reading(BaseModel):
    value: float
    label: str = ""


class Seen(BaseModel):
    reading: Reading | None = None
    label: str | None = None


@flowx.capability("cli.unstorable.label", version="1.0.0")
def label(ctx: flowx.StepContext, reading: Reading) -> str:
    return reading.label


reading = (
    flowx.flow("cli.reading", version="1.0.0", input=Reading, state=Seen)
    .await_signal("reading", Reading, into="reading")
    .step(label, into="label")
    .build()
)

FLOWS = [reading]
