"""The root of every error FlowX raises.

Callers never have to catch a driver's exception (sqlite3, psycopg, redis): each backend
translates at its seam. Every error carries the facts that explain it as attributes, and a
``code`` a program can branch on, so a message can change without breaking anyone.
"""

from __future__ import annotations

from typing import Any


class FlowXError(Exception):
    """Base class of every FlowX error.

    ``code`` is stable and machine-readable; the message says what was wrong and what to do.
    ``retryable`` tells a caller (or an HTTP layer mapping it to 503) that the same call may
    succeed later without any change on its side.
    """

    code: str = "flowx.error"
    retryable: bool = False

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        """The human-readable message, without the code: what to show a user or log."""
        return str(self.args[0]) if self.args else ""


class PlanError(FlowXError):
    """A flow definition that cannot run, found when the plan is built (R2.12).

    ``code`` is a ``FLOWX`` diagnostic id (``FLOWX1017``) and the message names the fix.
    """

    def __init__(self, code: str, message: str, *, flow_id: str | None = None) -> None:
        super().__init__(f"{code}: {message}", code=code)
        self.flow_id = flow_id


class DurabilityNotConfigured(FlowXError):
    """A Durable flow was started on a host that has no journal (R2.9).

    Running it ephemerally instead would silently drop the guarantee the author asked for.
    """

    code = "flow.durability_not_configured"


class FlowNotFound(FlowXError):
    """The flow id (or the version an instance is pinned to) is not registered on this host."""

    code = "flow.not_found"

    def __init__(self, flow_id: str, version: str | None, known: list[str]) -> None:
        what = f"{flow_id}@{version}" if version else flow_id
        listing = ", ".join(sorted(known)) or "none"
        super().__init__(
            f"flow {what!r} is not registered on this host (registered: {listing}); "
            "pass it in FlowHost(flows=[...]) or start a worker that carries it"
        )
        self.flow_id = flow_id
        self.version = version


class InputInvalid(FlowXError):
    """A flow input (or signal payload) does not validate against its declared model."""

    code = "flow.input_invalid"

    def __init__(
        self, flow_id: str, detail: str, *, fields: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(f"input for flow {flow_id!r} is invalid: {detail}")
        self.flow_id = flow_id
        self.detail = detail
        #: One entry per bad field (``loc``, ``msg``, ``type``), when pydantic found them.
        self.fields = fields or []


class SerialisationError(FlowXError):
    """A value cannot be written as canonical JSON (NaN, an object with no JSON form, ...),
    or could be only by changing it (a lone surrogate, a set, a non-str key): SPEC R9.5.

    ``path`` names the field (``result.items[3].name``) when it is known. Where the value
    came from sets the ``code``: ``step.result_unstorable``, ``flow.input_unstorable``,
    ``signal.payload_unstorable``, ``emit.payload_unstorable``; ``flowx.not_serialisable``
    from the codec itself.
    """

    code = "flowx.not_serialisable"

    def __init__(self, message: str, *, code: str | None = None, path: str | None = None) -> None:
        super().__init__(message, code=code)
        self.path = path


class NonDeterminismError(FlowXError):
    """The journal of an instance does not match the plan it is being replayed against.

    Raised instead of guessing: a row recorded for step 3 named ``reserve`` that the plan now
    calls ``capture`` means the flow changed under a running instance (R2.6, R2.8).
    """

    code = "flow.nondeterminism"


class CapabilityVersionMissing(NonDeterminismError):
    """The journal pinned a capability version this node does not register (R2.6): the
    instance is sound, this node cannot run it; a node that carries the version can."""

    code = "flow.capability_version_missing"


class IdempotencyConflict(FlowXError):
    """An idempotency key was reused for a different flow or a different input (R4.1)."""

    code = "flow.idempotency_conflict"


class SettingsError(FlowXError):
    """A host setting is out of range; found at start-up rather than on the first request (R3.6)."""

    code = "flowx.settings_invalid"


class CapabilityNotFound(FlowXError):
    """No registered capability matches the id and version a step asks for."""

    code = "capability.not_found"


class InstanceNotFound(FlowXError):
    """No instance has that id in this journal."""

    code = "instance.not_found"

    def __init__(self, instance_id: str) -> None:
        super().__init__(f"no flow instance {instance_id!r} in this journal")
        self.instance_id = instance_id


class CorrelationNotFound(InstanceNotFound):
    """No instance carries that correlation id (a signal by correlation, issue 18)."""

    def __init__(self, correlation_id: str) -> None:
        FlowXError.__init__(
            self, f"no flow instance has correlation id {correlation_id!r} in this journal"
        )
        self.instance_id = ""
        self.correlation_id = correlation_id


class DeadLetterNotFound(FlowXError):
    """No dead letter has that event id (never dead-lettered, already resent, or published)."""

    code = "outbox.dead_letter_not_found"

    def __init__(self, event_id: str) -> None:
        super().__init__(
            f"no dead letter {event_id!r} in this outbox; `flowx outbox dead-letters` lists them"
        )
        self.event_id = event_id


class FlowFailed(FlowXError):
    """Raised by ``FlowHandle.result()`` for an instance that ended in a failure state."""

    code = "flow.failed"

    def __init__(self, instance_id: str, state: str, error: object) -> None:
        super().__init__(f"flow instance {instance_id} ended {state}: {error}")
        self.instance_id = instance_id
        self.state = state
        self.error = error


class NonRetryableError(FlowXError):
    """Raise from a capability to fail its step at once, without using up retries.

    For errors no retry can fix: a card declined, an order that does not exist.
    """

    code = "step.non_retryable"


class JournalNotFound(FlowXError):
    """A command that only reads was pointed at a journal that does not exist; nothing was
    created. The message names what was looked for."""

    code = "store.journal_not_found"


class IllegalState(FlowXError):
    """The instance is not in a state where what was asked can be done: a replay of one that is
    not stopped where ``--from`` says, or one that moved on meanwhile. Nothing was written; the
    message names the state it is in."""

    code = "instance.illegal_state"


class RequestInvalid(FlowXError):
    """What was asked is malformed, whatever state the instance is in: fix the request (the
    command line, the call) and ask again. A class of its own so a caller (the CLI's exit
    codes, an HTTP layer's 400) can tell "your request" from "our state" without matching
    code strings."""

    code = "flowx.request_invalid"


class FlowsInvalid(RequestInvalid):
    """``--flows`` does not name plans that can be loaded: a usage error (exit 2)."""

    code = "worker.bad_flows"


class SignalUnknown(RequestInvalid):
    """A signal name the flow never waits for: it could never be taken, so it is not kept."""

    code = "signal.unknown"


class SignalPayloadInvalid(RequestInvalid):
    """A signal payload that does not validate against the type the flow waits for."""

    code = "signal.payload_invalid"


class InputUnreadable(RequestInvalid):
    """Input given as JSON text (a command-line ``--input``, ``--payload``) that is not UTF-8
    JSON FlowX can read: refused before a host sees it."""

    code = "cli.input_unreadable"


class FlowNotCarried(RequestInvalid):
    """The plans a command was given (``--flows``) do not define the flow the instance runs:
    the command line is missing a module, the flow itself may well exist."""

    code = "cli.flow_not_carried"


class InputUnstorable(SerialisationError, RequestInvalid):
    """A start whose input (or key) the journal cannot store (R9.5): nothing was written, and
    the same value never will be, so it is the request that must change."""

    code = "flow.input_unstorable"


class SignalPayloadUnstorable(SerialisationError, RequestInvalid):
    """A signal whose payload (or key) the journal cannot store (R9.5); as ``InputUnstorable``."""

    code = "signal.payload_unstorable"


class CorrelationAmbiguous(RequestInvalid):
    """A signal by correlation id matched several instances that have not ended: which one is
    meant cannot be told, so none gets it. Name the instance instead."""

    code = "signal.ambiguous_correlation"

    def __init__(self, correlation_id: str, live: int) -> None:
        super().__init__(
            f"correlation id {correlation_id!r} names {live} flow instances that have not "
            "ended; a signal goes to one: name its instance id instead"
        )
        self.correlation_id = correlation_id
        self.live = live
