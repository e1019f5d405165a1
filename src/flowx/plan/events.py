"""Event contracts: what ``emit`` stages in the outbox.

``@flowx.event("order.placed", version="1", sensitive={"card_number"})`` on a pydantic model
declares the contract: its type, its schema version, its serialiser (pydantic, through the
canonical codec) and which fields are redacted before the event is stored (R5.1).

An event leaves the journal for brokers and consumers FlowX does not control, so it is
redacted, never sealed: a declared name is redacted wherever it occurs, at every depth (in a
nested model, a list of them, a dict), and so is every member that is sensitive by type
(``SecretStr``, ``SecretBytes``, ``flowx.Sensitive[...]``) whether declared or not.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pydantic import BaseModel

from flowx import codec, sealing
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
        plain = _redact(sealing.redacted(event, plain, REDACTED), self.sensitive)
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
        unknown = hidden - _names(cast(type[BaseModel], cls), set())
        if unknown:
            raise FlowXError(
                f"@flowx.event({event_type!r}): sensitive fields {sorted(unknown)} are not "
                f"fields of {cls.__name__} or of a model it holds",
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


def _redact(value: Any, names: frozenset[str]) -> Any:
    """``value`` with every key in ``names`` redacted, at every depth (R5.1)."""
    if not names:
        return value
    if isinstance(value, dict):
        return {k: REDACTED if k in names else _redact(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, names) for v in value]
    return value


def _names(cls: type[BaseModel], seen: set[type[BaseModel]]) -> set[str]:
    """The field names (and aliases) of ``cls`` and of every model its fields can hold."""
    if cls in seen:
        return set()
    seen.add(cls)
    found: set[str] = set()
    for name, info in cls.model_fields.items():
        found.update(n for n in (name, info.alias, info.serialization_alias) if n)
        for model in _models_in(info.annotation):
            found |= _names(model, seen)
    return found


def _models_in(tp: Any) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in typing.get_args(tp) for m in _models_in(arg)]
