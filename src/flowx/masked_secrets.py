"""Secrets pydantic would store as ``"**********"``: found, so the value is refused, not lost.

A ``SecretStr`` is sealed where a declared type says one can be (``flowx.sealing``). Where none
does — a field typed ``Any``, a ``dict`` or ``list`` declared without element types, a ``set``,
a model's extra fields, a ``pydantic.Secret[T]`` (which the sealer cannot seal) — pydantic's
serialiser writes its mask instead, and the journal would keep the mask: the secret lost
without a word, read back as ten asterisks. That is silently changed data, so the codec refuses
it (R9.5, R9.8), naming where the secret is and what to declare.

The check costs nothing on the step commit's path: ``codec.dumps`` looks for the mask in the
text it just encoded (one C-level substring search) and walks the value only when the mask is
there. A string that merely *is* ``"**********"`` is no secret: the walk then finds none, and
the value is stored as it is. The walk follows the sealer's own: it descends where the sealer
does (members, fields whose declared type can hold a secret, list and dict items), and below
any part the sealer does not look into, every secret found is one pydantic masked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, Final

import pydantic
from pydantic import BaseModel, SecretBytes, SecretStr

from flowx.codec_checks import MAX_DEPTH
from flowx.sealing import MASK, SEAL_JSON, dataclass_fields, members, nested_fields

#: The mask as it appears in encoded JSON text.
MASK_JSON: Final = f'"{MASK}"'

#: Every pydantic secret type: ``SecretStr``, ``SecretBytes`` and the generic ``Secret[T]``.
_SECRETS: Final = (SecretStr, SecretBytes, pydantic.Secret)


def refusal(value: Any, root: str) -> tuple[str, str] | None:
    """Where the first secret in ``value`` that the sealer would leave to pydantic's mask is
    (its path under ``root``), and why that is refused and what to do; ``None`` if every
    secret in it is sealed."""
    found = _walked(value, root, 0)
    if found is None:
        return None
    path, secret = found
    lost = "pydantic would store it as '**********' and the value would be lost"
    if not isinstance(secret, SecretStr | SecretBytes):
        return path, (
            f"{path} is a pydantic Secret[...], which FlowX cannot seal: {lost}; declare it "
            "SecretStr or SecretBytes, or mark the field Sensitive"
        )
    return path, (
        f"{path} holds a secret where no declared type says one can be, so it cannot be "
        f"sealed: {lost}; declare the field's type (SecretStr, list[SecretStr], a model with "
        "SecretStr fields) or mark the field Sensitive"
    )


#: Where a secret pydantic would mask is, and the secret itself.
Found = tuple[str, Any] | None


def _walked(v: Any, path: str, depth: int) -> Found:
    """``v`` at a place the sealer walks: a ``SecretStr``/``SecretBytes`` here is sealed."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(v, SecretStr | SecretBytes):
        return None
    if isinstance(v, _SECRETS):  # a Secret[T]: the sealer has no sealed form for it
        return path, v
    if isinstance(v, BaseModel):
        return _model(v, path, depth)
    if isinstance(v, list | tuple):
        return _first(_walked(x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v))
    if isinstance(v, dict):
        return _first(_walked(x, f"{path}.{k}", depth + 1) for k, x in v.items())
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return _dataclass(v, path, depth)
    return _anywhere(v, path, depth)  # a set, ...: the sealer does not look inside


def _model(v: BaseModel, path: str, depth: int) -> Found:
    cls = type(v)
    special = {m.name: m for m in members(cls)}
    nested = {name for name, _ in nested_fields(cls)}
    for name, info in cls.model_fields.items():
        m = special.get(name)
        if m is not None and m.seal is not None:
            continue  # sealed whole, a secret inside it included
        at = f"{path}.{info.serialization_alias or info.alias or name}"
        look = _walked if m is not None or name in nested else _anywhere
        found = look(getattr(v, name, None), at, depth + 1)
        if found is not None:
            return found
    extra = v.__pydantic_extra__ or {}
    return _first(_anywhere(x, f"{path}.{k}", depth + 1) for k, x in extra.items())


def _dataclass(v: Any, path: str, depth: int) -> Found:
    walked = {name: (key, seal) for name, key, seal in dataclass_fields(type(v))}
    for f in dataclasses.fields(v):
        key, seal = walked.get(f.name, (f.name, None))
        if seal == SEAL_JSON:
            continue  # sealed whole
        look = _walked if f.name in walked else _anywhere
        found = look(getattr(v, f.name, None), f"{path}.{key}", depth + 1)
        if found is not None:
            return found
    return None


def _anywhere(v: Any, path: str, depth: int) -> Found:
    """``v`` below a part the sealer never looks into: any secret here is masked."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(v, _SECRETS):
        return path, v
    if isinstance(v, BaseModel):
        fields = {name: getattr(v, name, None) for name in type(v).model_fields}
        items = [*fields.items(), *(v.__pydantic_extra__ or {}).items()]
        return _first(_anywhere(x, f"{path}.{k}", depth + 1) for k, x in items)
    if isinstance(v, dict):
        return _first(_anywhere(x, f"{path}.{k}", depth + 1) for k, x in v.items())
    if isinstance(v, list | tuple | set | frozenset):
        return _first(_anywhere(x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v))
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return _first(
            _anywhere(getattr(v, f.name, None), f"{path}.{f.name}", depth + 1)
            for f in dataclasses.fields(v)
        )
    return None


def _first(found: Iterator[Found]) -> Found:
    return next((f for f in found if f is not None), None)
