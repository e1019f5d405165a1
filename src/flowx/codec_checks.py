"""Why a value cannot be stored as it is (R9.5): the walks that name the field.

``codec.dumps`` encodes at once what its fast scan finds plain; only a value the scan cannot
vouch for, or one that failed to encode, is walked here, so the message can name the part
(``result.items[3].price is nan: ...``) and say what to do. Two walks: one over a value the
caller gave (``refuse_if_found``), and one over the parts of a model or dataclass that a
field typed ``Any`` leaves to pydantic's guess (``refuse_if_loose``), where pydantic would
otherwise store something else than the value — NaN as null, a set as a list.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any, Final
from uuid import UUID

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from flowx.errors import SerialisationError

#: Types stored exactly as they are (floats are checked for NaN by the encoder).
SCALARS: Final = frozenset({str, int, float, bool, type(None)})
#: Types whose own serialiser is the contract (their declared types read them back).
DECLARED: Final = (BaseModel, datetime, date, time, timedelta, UUID, Decimal, Enum)
#: How deep the field-naming walk goes; deeper (or self-containing) values are refused.
MAX_DEPTH: Final = 500

WHAT_TO_DO = (
    "return a pydantic model, a dataclass or plain JSON values "
    "(str, int, float, bool, None, list, dict with str keys)"
)


def is_dataclass_instance(v: Any) -> bool:
    return dataclasses.is_dataclass(v) and not isinstance(v, type)


# -- the walk that names the field (errors only) -------------------------------------------


def refuse_if_found(value: Any, root: str, *, raw: bool) -> None:
    """Raise ``SerialisationError`` for the first field of ``value`` that cannot be stored.

    ``raw``: ``value`` is what the caller gave (sets, bytes, non-str keys may be in it);
    otherwise it is already plain JSON values and only strings and floats can be wrong.
    """
    path: list[str] = [root]
    problem = _problem(value, path, 0, raw)
    if problem is not None:
        # A cycle's path would be MAX_DEPTH steps long: keep its start, which locates it.
        where = "".join(path) if len(path) <= 12 else "".join(path[:12]) + "..."
        raise SerialisationError(f"{where} {problem}", path=where)


def _problem(v: Any, path: list[str], depth: int, raw: bool) -> str | None:
    """Why ``v`` cannot be stored as is, or ``None``; on a problem ``path`` ends at it."""
    if isinstance(v, str):
        at = surrogate_at(v)
        return None if at is None else surrogate_problem(v, at)
    if isinstance(v, bool | int) or v is None:
        return None
    if isinstance(v, float):
        if math.isfinite(v):
            return None
        return f"is {v!r}: NaN and Infinity have no JSON form; store null or a string instead"
    if depth >= MAX_DEPTH:
        return f"is nested more than {MAX_DEPTH} levels deep, or contains itself"
    if isinstance(v, dict):
        for k, item in v.items():
            if not isinstance(k, str):
                return (
                    f"has the key {k!r} ({type(k).__name__}): JSON keys are strings, so it "
                    f"would be stored as {key_text(k)!r} and read back as a str; use str "
                    "keys, or a pydantic model that declares the key type"
                )
            at = surrogate_at(k)
            if at is not None:
                return f"has the key {k!r}, which {surrogate_problem(k, at)}"
            path.append(field_path(k))
            found = _problem(item, path, depth + 1, raw)
            if found is not None:
                return found
            path.pop()
        return None
    if isinstance(v, list | tuple):
        for index, item in enumerate(v):
            path.append(f"[{index}]")
            found = _problem(item, path, depth + 1, raw)
            if found is not None:
                return found
            path.pop()
        return None
    if not raw:  # pragma: no cover - plain JSON values are all handled above
        return None
    return _raw_problem(v)


def _raw_problem(v: Any) -> str | None:
    """A value that is not plain JSON: refused if storing it would change it."""
    kind = type(v).__name__
    if isinstance(v, set | frozenset):
        return (
            f"is a {kind}: a set has no order, so one value would be stored as differently "
            "ordered lists; store a sorted list (or declare the field set[...] on a model)"
        )
    if isinstance(v, bytes | bytearray | memoryview):
        return f"is {kind}: JSON has no bytes; decode it to str, or base64-encode it"
    if isinstance(v, DECLARED) or is_dataclass_instance(v):
        return None  # its own serialiser is the contract; its output is checked after
    if isinstance(v, Iterator):
        return (
            f"is a {kind}: storing it would consume it, and the value would be lost; return a list"
        )
    try:
        to_jsonable_python(v)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        return f"({kind}) has no JSON form ({exc}); {WHAT_TO_DO}"
    return None


# -- fields typed Any ----------------------------------------------------------------------
#
# pydantic serialises a model or dataclass field declared ``Any`` (or ``object``, or a model's
# extra field) by looking at the value: NaN becomes null (in a model), bytes become text, a
# set a list, an int key a str key. No declared type reads it back, so that would change
# stored data; such a field is checked as a raw value instead. Classes without one are not
# walked (known per class, cached): this runs on every step commit.


def refuse_if_loose(value: Any, root: str) -> None:
    path: list[str] = [root]
    problem = _loose_problem(value, path, 0, _DECLARED_TYPE)
    if problem is not None:
        where = "".join(path) if len(path) <= 12 else "".join(path[:12]) + "..."
        raise SerialisationError(f"{where} {problem}", path=where)


#: The annotation of a part whose type is declared (or not known to be loose).
_DECLARED_TYPE: Final = object()


def _loose_problem(v: Any, path: list[str], depth: int, annotation: Any) -> str | None:
    """Like ``_problem`` with ``raw``, for the parts of ``v`` no declared type covers;
    ``annotation`` is the declared type of ``v``."""
    if depth >= MAX_DEPTH:
        return None  # the encoder refuses it, with its own message
    if _is_loose(annotation):
        found = _problem(v, path, depth, raw=True)
        if found is not None:
            return found
    if isinstance(v, BaseModel) or is_dataclass_instance(v):
        cls: type = type(v)
        if not has_loose_fields(cls):
            return None
        parts: list[tuple[str, Any, Any]] = [
            (name, getattr(v, name, None), declared) for name, declared in _loose_fields(cls)
        ]
        if isinstance(v, BaseModel):
            parts += [(str(k), item, Any) for k, item in (v.__pydantic_extra__ or {}).items()]
        for name, item, declared in parts:
            path.append(field_path(name))
            found = _loose_problem(item, path, depth + 1, declared)
            if found is not None:
                return found
            path.pop()
        return None
    if isinstance(v, dict):
        inner = _inner(annotation, dict)
        scalars_ok = not _is_loose(inner)  # else each value is checked raw, below
        for k, item in v.items():
            if scalars_ok and type(item) in SCALARS:
                continue
            path.append(field_path(k) if isinstance(k, str) else f"[{k!r}]")
            found = _loose_problem(item, path, depth + 1, inner)
            if found is not None:
                return found
            path.pop()
    elif isinstance(v, list | tuple):
        inner = _inner(annotation, list)
        scalars_ok = not _is_loose(inner)
        for index, item in enumerate(v):
            if scalars_ok and type(item) in SCALARS:
                continue
            path.append(f"[{index}]")
            found = _loose_problem(item, path, depth + 1, inner)
            if found is not None:
                return found
            path.pop()
    return None


def _inner(annotation: Any, container: type) -> Any:
    """The declared type of the values (``dict``) or items (``list``) of a container whose
    own declared type is ``annotation``; ``Any`` when only a guess covers them."""
    if annotation is _DECLARED_TYPE:
        return _DECLARED_TYPE
    if _is_loose(annotation):
        return Any
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _inner(args[0], container)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _inner(options[0], container)
    elif container is dict and isinstance(origin, type) and issubclass(origin, Mapping):
        return args[1] if len(args) == 2 else Any
    elif container is list and origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
    elif container is list and isinstance(origin, type) and issubclass(origin, Iterable):
        return args[0] if args else Any
    return Any if _mentions_loose(annotation) else _DECLARED_TYPE


def _mentions_loose(annotation: Any) -> bool:
    stack = [annotation]
    while stack:
        a = stack.pop()
        if _is_loose(a):
            return True
        stack.extend(typing.get_args(a))
    return False


@functools.cache
def _declared_fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """``(name, declared type)`` of a model's or a dataclass's fields (cached per class). A
    dataclass whose annotations cannot be resolved counts as fully declared: no guess."""
    if issubclass(cls, BaseModel):
        return tuple((name, info.annotation) for name, info in cls.model_fields.items())
    fields = dataclasses.fields(typing.cast(Any, cls))
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # a forward reference that names nothing importable
        return tuple((f.name, _DECLARED_TYPE) for f in fields)
    return tuple((f.name, hints.get(f.name, Any)) for f in fields)


@functools.cache
def _loose_fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """The fields of ``cls`` whose declared type leaves some part to pydantic's guess: the
    only ones the walk needs to look into."""
    return tuple(
        (name, declared)
        for name, declared in _declared_fields(cls)
        if _mentions_loose(declared) or _has_loose_fields_in(declared)
    )


def _has_loose_fields_in(annotation: Any) -> bool:
    """Whether a model or dataclass named anywhere in ``annotation`` has loose fields."""
    stack = [annotation]
    while stack:
        a = stack.pop()
        if has_fields(a):
            if has_loose_fields(a):
                return True
            continue
        stack.extend(typing.get_args(a))
    return False


def _extra_allowed(cls: type) -> bool:
    return issubclass(cls, BaseModel) and cls.model_config.get("extra") == "allow"


def has_fields(cls: object) -> bool:
    return isinstance(cls, type) and (issubclass(cls, BaseModel) or dataclasses.is_dataclass(cls))


@functools.cache
def has_loose_fields(cls: type) -> bool:
    """Whether a ``cls`` value (a model or a dataclass) can hold a part no declared type
    covers (cached per class)."""
    seen: set[object] = set()
    stack: list[Any] = [cls]
    while stack:
        annotation = stack.pop()
        if _is_loose(annotation) or (has_fields(annotation) and _extra_allowed(annotation)):
            return True
        if has_fields(annotation):
            if annotation not in seen:
                seen.add(annotation)
                stack.extend(declared for _, declared in _declared_fields(annotation))
            continue
        stack.extend(typing.get_args(annotation))
    return False


#: Containers that, declared without element types (``dict``, ``typing.List``), leave their
#: contents to pydantic's guess as ``Any`` does: a NaN in a bare ``dict`` field was written as
#: ``null``, a ``set`` as a list, an int key as a str, all without a word.
_BARE: Final = frozenset({dict, list, set, frozenset, tuple})


def _is_loose(annotation: Any) -> bool:
    """``Any``, ``object``, no annotation at all, or a container declared without element
    types: pydantic guesses how to serialise what it holds."""
    if annotation is Any or annotation is object or annotation is None:
        return True
    if isinstance(annotation, type):
        return annotation in _BARE
    origin = typing.get_origin(annotation)  # ``typing.Dict`` bare: origin dict, no args
    return origin in _BARE and not typing.get_args(annotation) and annotation is not tuple[()]


def surrogate_at(s: str) -> int | None:
    if s.isascii():
        return None
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def surrogate_problem(s: str, at: int) -> str:
    return (
        f"holds a lone surrogate {s[at]!r} at index {at}, which UTF-8 (and so the journal) "
        "cannot store; it usually comes from bytes decoded with errors='surrogateescape' or "
        "from half of a \\uXXXX pair: decode strictly, or replace it before storing"
    )


def field_path(key: str) -> str:
    return f".{key}" if key.isidentifier() else f"[{key!r}]"


def key_text(key: Any) -> str:
    """The string a non-str key would have been stored as, had it been converted quietly."""
    try:
        return str(next(iter(to_jsonable_python({key: 0}))))
    except (PydanticSerializationError, TypeError, ValueError):
        return str(key)
