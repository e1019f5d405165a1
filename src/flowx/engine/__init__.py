"""The step loop. Pure: it knows plans and the store protocols, and does no I/O of its own."""

from flowx.engine.context import StepContext
from flowx.engine.runner import (
    Committer,
    CompensationAlert,
    Execution,
    RunResult,
    WaitPort,
    error_payload,
)

__all__ = [
    "Committer",
    "CompensationAlert",
    "Execution",
    "RunResult",
    "StepContext",
    "WaitPort",
    "error_payload",
]
