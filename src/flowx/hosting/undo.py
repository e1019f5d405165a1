"""Whether a completed sub-flow child can be undone for its parent's compensation, and what
its undo ended with: the decisions ``InstanceRunner.undo_child`` makes around the run."""

from __future__ import annotations

from flowx.engine.runner import RunResult
from flowx.errors import FlowXError, NonRetryableError
from flowx.stores.records import InstanceRecord, InstanceState


def undoable(child_id: str, record: InstanceRecord | None) -> bool:
    """``True``: run the child's compensations. ``False``: nothing is left to undo (it
    failed, timed out or was cancelled, and compensated itself). Raises when it cannot be
    undone now (``sub_flow.child_busy``, retried) or ever (``NonRetryableError``)."""
    if record is None:
        # The parent's journal holds the child's success, so the child existed: it is gone
        # (deleted by hand, or restored without it). Saying nothing would skip its effects.
        raise NonRetryableError(
            f"child instance {child_id} is not in the journal any more, so its effects cannot "
            "be undone; restore it from the archive, then replay this instance"
        )
    state = record.state
    if state in (InstanceState.FAILED, InstanceState.TIMED_OUT, InstanceState.CANCELLED):
        return False
    if state is InstanceState.COMPENSATION_FAILED:
        raise NonRetryableError(
            f"child instance {child_id} could not be undone: its own compensation ran out "
            f"({record.error}); replay the child, then this instance"
        )
    if state is InstanceState.TERMINATED:
        raise NonRetryableError(
            f"child instance {child_id} was terminated, so nothing undid its effects; undo "
            "them by hand, then replay this instance"
        )
    if state not in (InstanceState.COMPLETED, InstanceState.COMPENSATING):
        raise FlowXError(
            f"child instance {child_id} is {state.value}; it is undone once it ends",
            code="sub_flow.child_busy",
        )
    return True


def undone(child_id: str, result: RunResult) -> None:
    """After the child's undo ran: refuse an undo that did not finish undoing."""
    if result.outcome == "compensation_failed":
        raise NonRetryableError(
            f"child instance {child_id} could not be undone: its compensation ran out "
            f"({result.error}); replay the child, then this instance"
        )
    if result.outcome == "terminated":
        raise NonRetryableError(
            f"child instance {child_id} was terminated while it was being undone; undo "
            "what is left by hand, then replay this instance"
        )
