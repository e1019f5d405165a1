"""What a failed attempt leaves in the journal, and when a node has no attempt left.

A failure row's result is this JSON (``error_payload``); the retry budget is counted from
those rows (``exhausted``), so a resumed run on another node decides exactly as this one
would have.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from flowx import codec
from flowx.errors import NonDeterminismError, NonRetryableError, SerialisationError
from flowx.plan.model import Retry

#: The error code of a flow past its deadline (SPEC §8); its failure row ends it TimedOut.
DEADLINE_EXCEEDED = "flow.deadline_exceeded"
#: A forward replay's undo of the effects it re-runs ran out (``flowx replay --from``).
UNDO_FAILED = "replay.undo_failed"


def error_payload(exc: BaseException, *, retryable: bool | None = None) -> dict[str, Any]:
    """The JSON stored as a failed attempt's result."""
    if retryable is None:
        retryable = not isinstance(
            exc, NonRetryableError | SerialisationError | ValidationError | NonDeterminismError
        )
    payload: dict[str, Any] = {
        "type": type(exc).__qualname__,
        # R9.5: a failure row must be storable even when its message quotes a value that is
        # not; R9.8: a message that quotes one of the instance's secrets is stored masked.
        "message": codec.printable(codec.scrub(str(exc))[:4000]),
        "code": getattr(exc, "code", None),
        "retryable": retryable,
    }
    if isinstance(exc, SerialisationError) and exc.path is not None:
        payload["field"] = codec.printable(exc.path)
    return payload


def exhausted(failures: list[dict[str, Any]], policy: Retry) -> bool:
    """No attempt left: the last failure was not retryable, or the budget is spent."""
    return bool(failures) and (
        not failures[-1].get("retryable", True) or len(failures) >= policy.attempts
    )
