"""Event contracts: what ``emit`` stages in the outbox.

``@flowx.event("order.placed", version="1", sensitive={"card_number"})`` on a pydantic model
declares the contract: its type, its schema version, its serialiser (pydantic, through the
canonical codec) and which fields are redacted before the event is stored (R5.1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pydantic import BaseModel

from flowx import codec
from flowx.errors import FlowXError, SerialisationError

M = TypeVar("M", bound=type[BaseModel])

REDACTED = "[redacted]"
#: An emit whose event cannot be stored (SPEC R9.5).
EMIT_UNSTORABLE = "emit.payload_unstorable"


@dataclass(frozen=True, kw_only=True, slots=True)
class EventContract:
    type: str
    schema_version: str
    sensitive: frozenset[str]

    def encode(self, event: BaseModel) -> str:
        """The stored payload, sensitive fields redacted. R9.5: an event the journal cannot
        store fails its emit step (``emit.payload_unstorable``), never the commit."""
        whose = f"event {self.type!r}"
        try:
            plain = codec.to_json_value(event)
        except SerialisationError as exc:
            raise codec.refused(exc, whose, EMIT_UNSTORABLE) from exc
        if isinstance(plain, dict):
            for name in self.sensitive:
                if name in plain:
                    plain[name] = REDACTED
        return codec.dumps(plain, root="event", code=EMIT_UNSTORABLE, context=whose)


def event(
    event_type: str, *, version: str = "1", sensitive: Iterable[str] = ()
) -> Callable[[M], M]:
    """Declare a pydantic model as an event contract."""

    def decorate(cls: M) -> M:
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            raise FlowXError(
                f"@flowx.event({event_type!r}) must decorate a pydantic BaseModel subclass",
                code="event.not_a_model",
            )
        hidden = frozenset(sensitive)
        unknown = hidden - set(cast(type[BaseModel], cls).model_fields)
        if unknown:
            raise FlowXError(
                f"@flowx.event({event_type!r}): sensitive fields {sorted(unknown)} are not "
                f"fields of {cls.__name__}",
                code="event.bad_sensitive",
            )
        cls.__flowx_event__ = EventContract(  # type: ignore[attr-defined]
            type=event_type, schema_version=version, sensitive=hidden
        )
        return cls

    return decorate


def contract_of(cls: Any) -> EventContract | None:
    found = getattr(cls, "__flowx_event__", None)
    return found if isinstance(found, EventContract) else None
