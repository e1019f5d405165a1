"""The options of a ``step(...)``, turned into a checked ``StepNode``.

Kept apart from the builder so that each option a step gains (retry, compensation, timeout, …)
is validated in one place, with the step's name in every message (R2.12), and the builder
module stays a readable size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from flowx.plan.model import (
    DEFAULT_COMPENSATION_RETRY,
    DEFAULT_STEP_RETRY,
    NO_RETRY,
    Retry,
    StepNode,
)
from flowx.plan.timeouts import STEP_TIMEOUT_INVALID, step_timeout

if TYPE_CHECKING:
    from datetime import timedelta

    from flowx.plan.builder import _Compiler, _Draft

#: The keyword options ``Body.step`` records, in the order it takes them.
STEP_OPTIONS = (
    "target",
    "version",
    "into",
    "retry",
    "compensate",
    "compensate_retry",
    "argument",
    "timeout",
)


def compile_step(
    c: _Compiler, d: _Draft, state_model: type[BaseModel], default_timeout: timedelta | None
) -> StepNode:
    """Check one step draft against its capability and the flow, and build its node."""
    a: dict[str, Any] = d.args
    cap = c.capability(a["target"], a["version"], "step", "FLOWX1002")
    name = d.name or cap.id
    where = f"step {name!r}"
    step_id = c.claim(name)
    c.check_into(a["into"], state_model, where)
    c.check_callable(a["argument"], "argument=", where)
    retry: Retry = a["retry"] or (DEFAULT_STEP_RETRY if cap.idempotent else NO_RETRY)
    if not cap.idempotent and retry.attempts > 1:
        raise c.error(
            "FLOWX1008",
            f"{where} asks for {retry.attempts} attempts, but {cap.ref} is declared "
            "idempotent=False and is never retried automatically (R4.2); drop retry= "
            "or make the capability idempotent (pass ctx.idempotency_key on)",
        )
    comp = None
    if a["compensate"] is not None:
        comp = c.capability(a["compensate"], None, f"{where} compensate=", "FLOWX1005")
    comp_retry: Retry = a["compensate_retry"] or DEFAULT_COMPENSATION_RETRY
    if comp is not None and not comp.idempotent:
        comp_retry = NO_RETRY
    try:
        timeout = step_timeout(a.get("timeout"), where=where)
    except ValueError as exc:
        raise c.error(STEP_TIMEOUT_INVALID, str(exc)) from exc
    return StepNode(
        step_id=step_id,
        name=name,
        capability=cap,
        into=a["into"],
        retry=retry,
        compensate=comp,
        compensate_retry=comp_retry,
        argument=a["argument"],
        timeout=timeout if timeout is not None else default_timeout,
    )
