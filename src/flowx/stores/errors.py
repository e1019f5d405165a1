"""Errors a store raises. Drivers' own exceptions never cross this seam.

Each carries its facts as attributes so a caller can act on them without parsing a message.
"""

from __future__ import annotations

from flowx.errors import FlowXError


class StoreError(FlowXError):
    """Base class of every store error."""

    code = "store.error"


class FencedOut(StoreError):
    """A write carried a token below the instance's fence: another node has taken it (R2.4).

    The writer is a zombie. It must abort, discard its work and run no compensation (R3.5).
    """

    code = "store.fenced_out"

    def __init__(self, instance_id: str, token: int, fence: int) -> None:
        super().__init__(
            f"write to instance {instance_id} refused: token {token} is below fence {fence} "
            "(another node holds a newer lease); this node must abort without compensating"
        )
        self.instance_id = instance_id
        self.token = token
        self.fence = fence


class DuplicateStep(StoreError):
    """A ``flow_step`` row with this key is already committed (R2.2). Never swallowed."""

    code = "store.duplicate_step"

    def __init__(self, instance_id: str, scope: str, step_id: int, attempt: int) -> None:
        super().__init__(
            f"step row ({instance_id}, scope={scope!r}, step={step_id}, attempt={attempt}) "
            "is already committed; the journal is append-only, so this write was refused"
        )
        self.instance_id = instance_id
        self.scope = scope
        self.step_id = step_id
        self.attempt = attempt


class JournalUnavailable(StoreError):
    """The journal cannot be reached or did not answer. Retryable (HTTP 503).

    After a failed *commit* the outcome is unknown: the write may have landed. Re-read the
    instance before re-executing anything.
    """

    code = "store.journal_unavailable"
    retryable = True
    http_status = 503


class JournalNoAnswer(JournalUnavailable):
    """A round trip to the journal got no answer within its deadline (R9.1).

    The connection was discarded. A write's outcome is unknown: recovery re-reads the
    instance before anything re-runs, and the fence refuses the write if it lands late.
    """

    code = "store.journal_no_answer"


class StoreMisconfigured(StoreError):
    """The server answered, and said the configuration is wrong: a database or role that does
    not exist, a password it refuses. Retrying cannot help, so a node stops with this
    instead of reconnecting for ever."""

    code = "store.misconfigured"


class StorePermissionDenied(StoreMisconfigured):
    """The server refused an operation to the role (or Redis user) FlowX logged in as (R9.8).

    A configuration fault, not an outage: the same call fails the same way until an operator
    grants the privilege, so it is never retried. The message names the login, what was
    refused and the grant (or group role) that would allow it; ``login`` and ``refused``
    carry the same facts for a program."""

    code = "store.permission_denied"

    def __init__(self, message: str, *, login: str | None, refused: str) -> None:
        super().__init__(message)
        self.login = login
        self.refused = refused


class LeaseUnavailable(StoreError):
    """The lease store cannot be reached. Retryable; no new durable work starts meanwhile."""

    code = "store.lease_unavailable"
    retryable = True
    http_status = 503


class LeaseLost(StoreError):
    """The lease is no longer held by this node: it expired, was released, or was taken.

    Leases fail closed: a renewal that cannot be confirmed is a lease lost.
    """

    code = "store.lease_lost"

    def __init__(self, instance_id: str, token: int, reason: str) -> None:
        super().__init__(f"lease on {instance_id} (token {token}) is lost: {reason}")
        self.instance_id = instance_id
        self.token = token
        self.reason = reason


class UnknownInstance(StoreError):
    """A write or read named an instance the journal does not have."""

    code = "store.unknown_instance"

    def __init__(self, instance_id: str) -> None:
        super().__init__(f"no flow instance {instance_id!r} in this journal")
        self.instance_id = instance_id


class NotAFlowXStore(StoreError):
    """The file or database holds something other than a FlowX journal. Nothing was changed."""

    code = "store.not_flowx"


class SchemaTooNew(StoreError):
    """The store's schema was migrated by a newer FlowX than this one. Nothing was changed."""

    code = "store.schema_too_new"

    def __init__(self, where: str, found: int, known: int) -> None:
        super().__init__(
            f"{where} has schema version {found}, but this FlowX knows only up to {known}; "
            "upgrade FlowX on this node (never downgrade a journal)"
        )
        self.found = found
        self.known = known


class SchemaNotMigrated(StoreError):
    """The store's schema is older than the code and automatic migration is off."""

    code = "store.schema_not_migrated"


class UnknownConsumer(StoreError):
    """A change subscription was read or committed before it was declared."""

    code = "changes.unknown_consumer"

    def __init__(self, consumer: str) -> None:
        super().__init__(
            f"no change subscription {consumer!r}; declare it first with "
            "stores.changes.subscribe(consumer, now=...)"
        )
        self.consumer = consumer


class InstanceFinished(StoreError):
    """A signal (or another wake-up) was sent to an instance that has already ended."""

    code = "instance.finished"

    def __init__(self, instance_id: str, state: str) -> None:
        super().__init__(
            f"flow instance {instance_id} has already ended ({state}); nothing was kept. "
            "`flowx show` gives its history"
        )
        self.instance_id = instance_id
        self.state = state
