"""Exit codes are chosen by the error's class (``flowx.cli.exits``), never by matching the
message or the code string: every raise site raises the class its code belongs to."""

from __future__ import annotations

import pytest

from flowx.cli.exits import (
    EXIT_ERROR,
    EXIT_ILLEGAL_STATE,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    exit_code,
)
from flowx.errors import (
    DeadLetterNotFound,
    FlowNotCarried,
    FlowNotFound,
    FlowXError,
    IdempotencyConflict,
    IllegalState,
    InputInvalid,
    InputUnreadable,
    InputUnstorable,
    InstanceNotFound,
    RequestInvalid,
    SerialisationError,
    SignalPayloadInvalid,
    SignalPayloadUnstorable,
    SignalUnknown,
)
from flowx.stores.errors import InstanceFinished, UnknownInstance


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InstanceNotFound("i1"), EXIT_NOT_FOUND),
        (UnknownInstance("i1"), EXIT_NOT_FOUND),
        (FlowNotFound("f", None, []), EXIT_NOT_FOUND),
        (DeadLetterNotFound("e1"), EXIT_NOT_FOUND),
        (IllegalState("not stopped there"), EXIT_ILLEGAL_STATE),
        (InstanceFinished("i1", "Completed"), EXIT_ILLEGAL_STATE),
        (SignalUnknown("never waits for it"), EXIT_USAGE),
        (SignalPayloadInvalid("wrong shape"), EXIT_USAGE),
        (InputUnreadable("--input: not JSON"), EXIT_USAGE),
        (FlowNotCarried("--flows lacks it"), EXIT_USAGE),
        (InputUnstorable("NaN", path="input.x"), EXIT_USAGE),
        (SignalPayloadUnstorable("NaN", path="payload.x"), EXIT_USAGE),
        (InputInvalid("f", "name: field required"), EXIT_ERROR),
        (IdempotencyConflict("reused"), EXIT_ERROR),
        (SerialisationError("step result: NaN", code="step.result_unstorable"), EXIT_ERROR),
        (FlowXError("anything else"), EXIT_ERROR),
        (FlowXError("Ephemeral", code="cli.ephemeral_flow"), EXIT_ERROR),
    ],
)
def test_each_error_class_has_its_exit_code(error: FlowXError, code: int) -> None:
    assert exit_code(error) == code


def test_a_code_string_alone_decides_nothing() -> None:
    # Only the class counts: a bare error carrying a class's code is still a plain FlowX error.
    assert exit_code(FlowXError("m", code="instance.illegal_state")) == EXIT_ERROR
    assert exit_code(SerialisationError("m", code="signal.unknown")) == EXIT_ERROR


def test_the_new_classes_keep_the_codes_scripts_already_branch_on() -> None:
    assert IllegalState.code == "instance.illegal_state"
    assert SignalUnknown.code == "signal.unknown"
    assert SignalPayloadInvalid.code == "signal.payload_invalid"
    assert InputUnreadable.code == "cli.input_unreadable"
    assert FlowNotCarried.code == "cli.flow_not_carried"
    assert InputUnstorable.code == "flow.input_unstorable"
    assert SignalPayloadUnstorable.code == "signal.payload_unstorable"
    # An unstorable value is still a SerialisationError to anyone catching that.
    assert issubclass(InputUnstorable, SerialisationError)
    assert issubclass(InputUnstorable, RequestInvalid)
