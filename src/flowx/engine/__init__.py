"""The step loop. Pure: it knows plans and the store protocols, and does no I/O of its own."""

from flowx.engine.context import StepContext
from flowx.engine.failures import error_payload
from flowx.engine.ports import Committer, RunPorts, WaitPort
from flowx.engine.runner import Execution, RunResult
from flowx.engine.saga import CompensationAlert
from flowx.engine.spec import RunSpec

__all__ = [
    "Committer",
    "CompensationAlert",
    "Execution",
    "RunPorts",
    "RunResult",
    "RunSpec",
    "StepContext",
    "WaitPort",
    "error_payload",
]
