"""R9.5 at the host's doors: what a start or a signal would store is checked before anything
is written, so a value the journal cannot store is refused with an error naming its field
instead of failing at the driver half-way through (or, for a start, leaving a lease behind).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel

from flowx import codec
from flowx.errors import InputInvalid, InputUnstorable, SerialisationError, SignalPayloadUnstorable
from flowx.plan.model import AwaitSignalNode, Plan, bound_for, walk
from flowx.sealing import MARK, Sealing, sealed_fields
from flowx.stores.records import InstanceRecord

#: A start whose input (or idempotency key, correlation id, partition key) cannot be stored.
INPUT_UNSTORABLE = InputUnstorable.code
#: A signal whose payload (or key) cannot be stored.
SIGNAL_UNSTORABLE = SignalPayloadUnstorable.code


@contextmanager
def _refused_as(error: type[SerialisationError]) -> Iterator[None]:
    """A value the codec refuses, raised as ``error``: its class says whose value it was, so a
    caller (the CLI's exit code) tells a bad request from a bad step result without its code."""
    try:
        yield
    except SerialisationError as exc:
        raise error(str(exc), path=exc.path) from exc


def start_input(plan: Plan, value: BaseModel) -> str:
    """The input's stored text; ``InputUnstorable`` (``flow.input_unstorable``) names the
    field of the input that cannot be stored (its keys: ``start_keys``)."""
    try:  # not ``_refused_as``: this runs on every start
        return codec.dumps(value, root="input", context=f"the start of {plan.ref}")
    except SerialisationError as exc:
        raise InputUnstorable(str(exc), path=exc.path) from exc


def same_input(sealing: Sealing | None, record: InstanceRecord, input_text: str) -> bool:
    """Whether a repeated start carries the input the first one stored. Sealed members
    differ as text (each seal has its own nonce), so they are compared opened (R9.8)."""
    if record.input == input_text:
        return True
    if MARK not in record.input:
        return False
    with codec.sealing(sealing):
        opened = codec.loads(record.input, root="input")
        return bool(opened == codec.loads(input_text, root="input"))


def start_keys(plan: Plan, *, idempotency_key: str | None, correlation_id: str | None) -> None:
    """The start's keys checked as text columns: first, since the instance id (which the
    input is sealed under) is derived from the idempotency key."""
    if idempotency_key is None and correlation_id is None:
        return
    whose = f"the start of {plan.ref}"
    with _refused_as(InputUnstorable):
        for root, key in (("idempotency_key", idempotency_key), ("correlation_id", correlation_id)):
            if key is not None:
                codec.text(key, root=root, context=whose)


def partition_of(plan: Plan, value: BaseModel) -> Any:
    """What ``plan.partition_key`` gives for ``value``; ``InputInvalid`` if it raises, so a
    bug in the author's selector refuses the start cleanly before anything is written."""
    if plan.partition_key is None:
        return None
    try:
        return plan.partition_key(value)
    except Exception as exc:
        raise InputInvalid(plan.flow_id, f"partition_key raised {exc!r}") from exc


def tenant_key(plan: Plan, key: Any) -> str | None:
    """The partition key ``plan.partition_key`` gave, as the text column it is stored in."""
    if key is None:
        return None
    whose = f"the start of {plan.ref}"
    with _refused_as(InputUnstorable):
        return codec.text(str(key), root="partition_key", context=whose)


def signal_payload(plan: Plan, name: str, value: Any, *, key: str | None) -> str:
    """A signal's stored payload; ``SignalPayloadUnstorable`` (``signal.payload_unstorable``)
    names the field of the payload, or the key, that cannot be stored."""
    whose = f"signal {name!r} for {plan.ref}"
    with _refused_as(SignalPayloadUnstorable):
        if key is not None:
            codec.text(key, root="key", context=whose)
        return codec.dumps(value, root="payload", context=whose, whole=_into_sealed(plan, name))


def _into_sealed(plan: Plan, name: str) -> bool:
    """Whether a wait for signal ``name`` puts its payload into a sealed state field (its own
    ``into``, or a for_each's that collects it): then the payload is sealed whole in the inbox
    as well, whatever its own type declares (R9.8)."""
    sealed = bound_for(plan.body, sealed_fields(plan.state_model))
    return bool(sealed) and any(
        isinstance(node, AwaitSignalNode) and node.signal == name and node.step_id in sealed
        for node in walk(plan.body)
    )


def storable_id(value: object) -> bool:
    """Whether ``value`` could be an id in the journal: a str UTF-8 can encode, without NUL.
    Asked before a lookup, so a malformed id is "not found" instead of a driver error."""
    if not isinstance(value, str) or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
