"""Why a run stops walking the plan: one exception type, one kind per reason.

The step loop is deeply nested (for_each bodies, fork branches, a wait's timeout path), and
every one of these reasons has to unwind all of it to a single place that decides what the run
returns: a failed step fails the flow (after compensating), a seal suspends it, a lost lease
aborts it. A single ``Halt`` carrying its kind keeps that decision in one ``match``-like
place (``Execution.run``) instead of six exception classes caught in six spots.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from flowx.plan.model import Node
from flowx.stores.records import StopRequest


class HaltKind(enum.Enum):
    """Why the run stopped; the first three end the instance, the others only this run."""

    #: A node failed for good: the flow fails (compensating first). Payload: node, scope, error.
    FAILED = "failed"
    #: The flow's deadline passed at a boundary (or cut a running step). Payload: node,
    #: scope, ``at`` (the deadline), ``running``.
    DEADLINE = "deadline"
    #: Nothing new may run: a fork sibling failed, or the instance is compensating.
    #: Payload: node and scope, when known.
    HALTED = "halted"
    #: The instance is sealed at a wait: the run ends, the instance does not. Payload: ``at``.
    SUSPENDED = "suspended"
    #: A draining node handed the instance back at a step boundary.
    YIELD = "yield"
    #: This node lost the right to write (R3.5). Payload: the reason (the message).
    ABORT = "abort"
    #: An operator cancelled or terminated the instance (R9.4). Payload: ``request``; node
    #: and scope where it was reached (none for a terminate reached mid-compensation).
    STOPPED = "stopped"


#: Kinds that end the instance (through ``Execution``'s failure path), as opposed to kinds
#: that only end this run.
ENDING = (HaltKind.FAILED, HaltKind.DEADLINE, HaltKind.HALTED, HaltKind.STOPPED)


class Halt(Exception):
    """The run stops here; ``kind`` says why, the other fields what the handler needs."""

    def __init__(
        self,
        kind: HaltKind,
        message: str = "",
        *,
        node: Node | None = None,
        scope: str = "",
        error: dict[str, Any] | None = None,
        at: datetime | None = None,
        running: bool = False,
        request: StopRequest | None = None,
    ) -> None:
        super().__init__(message or kind.value)
        self.kind = kind
        self.node = node
        self.scope = scope
        self.error: dict[str, Any] = error or {}
        self.at = at
        #: DEADLINE only: reached while the step ran (its attempt was cancelled).
        self.running = running
        #: STOPPED only: the operator's request.
        self.request = request

    @property
    def reason(self) -> str:
        return str(self)

    @classmethod
    def failed(cls, node: Node, scope: str, error: dict[str, Any]) -> Halt:
        return cls(HaltKind.FAILED, str(error.get("message")), node=node, scope=scope, error=error)

    @classmethod
    def deadline(cls, node: Node, scope: str, deadline: datetime, *, running: bool = False) -> Halt:
        return cls(
            HaltKind.DEADLINE,
            f"deadline {deadline.isoformat()} passed",
            node=node,
            scope=scope,
            at=deadline,
            running=running,
        )

    @classmethod
    def halted(cls, node: Node | None = None, scope: str = "") -> Halt:
        return cls(HaltKind.HALTED, node=node, scope=scope)

    @classmethod
    def suspended(cls, wake_at: datetime | None) -> Halt:
        return cls(HaltKind.SUSPENDED, at=wake_at)

    @classmethod
    def yielded(cls) -> Halt:
        return cls(HaltKind.YIELD)

    @classmethod
    def stopped(
        cls, node: Node | None, scope: str, request: StopRequest, *, running: bool = False
    ) -> Halt:
        return cls(
            HaltKind.STOPPED,
            f"{request.mode} requested by {request.by}",
            node=node,
            scope=scope,
            request=request,
            running=running,
        )

    @classmethod
    def abort(cls, reason: str) -> Halt:
        return cls(HaltKind.ABORT, reason)
