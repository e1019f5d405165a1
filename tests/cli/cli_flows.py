"""A flow for the CLI tests (imported with --flows tests.cli.cli_flows:FLOWS)."""

from __future__ import annotations

from pydantic import BaseModel

import flowx


class Greeting(BaseModel):
    name: str
    times: int = 1


class Said(BaseModel):
    text: str | None = None


@flowx.capability("cli.test.greet", version="1.0.0")
def greet(ctx: flowx.StepContext, g: Greeting) -> str:
    return " ".join([f"hello {g.name}"] * g.times)


greeting = (
    flowx.flow("cli.greeting", version="1.0.0", input=Greeting, state=Said)
    .step(greet, into="text")
    .build()
)

FLOWS = [greeting]

#: Same capability, no journal: `flowx start` must refuse it rather than run it and forget it.
scratch = (
    flowx.flow("cli.scratch", version="1.0.0", input=Greeting, state=Said, profile=flowx.Ephemeral)
    .step(greet, into="text")
    .build()
)

FLOWS_WITH_EPHEMERAL = [greeting, scratch]
