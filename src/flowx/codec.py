"""The one canonical JSON encoding every stored payload uses.

Sorted keys, compact separators, NaN and Infinity refused at encode time, integers of any size
kept, floats as Python's shortest round-trip ``repr``. One encoder, never mixed with another
library's float printing (``1e-07`` vs ``1e-7``), so bytes written today compare equal to bytes
written by a later release. Rows carry ``CODEC_VERSION`` so the encoding can change without
rewriting history. Never pickle.

**What the journal cannot store is refused here, before anything is committed (SPEC R9.5).**
A value that reached the driver and failed there would fail the whole commit (and, on
PostgreSQL, a group-commit batch with it), leave the step to be re-run by recovery, and fail
again. So ``dumps`` refuses, naming the field (``result.items[3].name``) and what to do:

- a ``str``, value or key, holding a lone surrogate (``"\\ud800"``): UTF-8 cannot encode it, so
  neither PostgreSQL nor SQLite can store it, and replacing it with U+FFFD would change data;
- NaN and Infinity: JSON has no form for them;
- a value that JSON could hold only by changing it: a ``set`` (no order: the same value would
  be stored as differently ordered lists), an iterator or generator (storing it consumes it),
  ``bytes`` (stored as text, read back as ``str``), a ``dict`` key that is not a ``str`` (``1``
  would be stored as ``"1"`` and read back as a string);
- anything else with no JSON form.

Tuples are stored as arrays (order kept). The documented inputs — pydantic models, dataclasses,
``datetime``/``date``/``time``/``timedelta``, ``UUID``, ``Decimal``, ``Enum`` — are converted by
their own (pydantic) serialiser: their declared types are the contract, and validation reads
them back (a field declared ``set[str]`` or ``dict[int, str]`` comes back as declared). What
that serialiser produces is checked like any other value.

The check is cheap: plain values are scanned once without building paths, the encoded text is
tested for surrogates in one C-level pass, and the slow walk that names the field runs only
when something is wrong.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any, Final, TypeVar
from uuid import UUID

from pydantic import BaseModel, TypeAdapter
from pydantic_core import PydanticSerializationError, to_jsonable_python

from flowx import sealing as _sealing
from flowx.errors import SerialisationError
from flowx.sealing import scrub as scrub
from flowx.sealing import sealing as sealing

CODEC_VERSION = 1

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

_encoder = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False
)

#: Types stored exactly as they are (floats are checked for NaN by the encoder).
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})
#: Types whose own serialiser is the contract (their declared types read them back).
_DECLARED: Final = (BaseModel, datetime, date, time, timedelta, UUID, Decimal, Enum)
#: How deep the field-naming walk goes; deeper (or self-containing) values are refused.
MAX_DEPTH: Final = 500
#: Containers the fast scan looks at before handing over to the walk that names fields; it
#: also bounds the scan of a value that contains itself.
_SCAN_BUDGET: Final = 100_000

#: What ``_scan`` found: plain JSON values only; declared types too; a model or dataclass
#: with a field typed ``Any`` as well; something else (judged by the walk).
_PLAIN, _HAS_DECLARED, _HAS_LOOSE, _SUSPECT = 0, 1, 2, 3

_WHAT_TO_DO = (
    "return a pydantic model, a dataclass or plain JSON values "
    "(str, int, float, bool, None, list, dict with str keys)"
)


def to_json_value(value: Any) -> Any:
    """Turn a pydantic model, dataclass, datetime, UUID, ... into plain JSON values."""
    try:
        return to_jsonable_python(value)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise SerialisationError(
            f"{type(value).__name__} has no JSON form ({exc}); {_WHAT_TO_DO}"
        ) from exc


def dumps(
    value: Any,
    *,
    root: str = "value",
    code: str | None = None,
    context: str | None = None,
    at: str | None = None,
    whole: bool | str = False,
) -> str:
    """Encode ``value`` canonically, or raise ``SerialisationError`` naming the field under
    ``root`` (``result``, ``input``, ``payload``, ``state`` ...) that cannot be stored as is
    and what to do (R9.5). ``context`` says whose value it is (``step 'x': the result of
    cap@1``) and ``code`` is the refusal's error code there (``step.result_unstorable``).

    Sensitive members (``flowx.sealing``) are sealed under the instance's keys, bound to
    ``root`` (and ``at``, a step) and their path: ``loads`` with the same ``root`` and ``at``
    opens them. ``whole`` seals the value as one, whatever it holds: a step's result bound
    for a sealed state field (``sealing.sealed_fields``); given a key, only that member of a
    dict is (a wait's row keeps its signal's ``seq`` readable without keys)."""
    if context is None:
        return _encode(value, root, at, whole)
    try:
        return _encode(value, root, at, whole)
    except SerialisationError as exc:
        raise refused(exc, context, code or exc.code) from exc


def _encode(value: Any, root: str, at: str | None = None, whole: bool | str = False) -> str:
    kind = _scan(value)
    if kind == _PLAIN:
        plain = value
    else:
        if kind == _SUSPECT:
            _refuse_if_found(value, root, raw=True)
        if kind != _HAS_DECLARED:
            _refuse_if_loose(value, root)
        try:
            plain = to_jsonable_python(value)
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            raise SerialisationError(
                f"{root} ({type(value).__name__}) has no JSON form ({exc}); {_WHAT_TO_DO}",
                path=root,
            ) from exc
        if type(value) not in _sealing.PLAIN_MODELS:  # the step commit's usual case: skipped
            where = root if at is None else f"{root}:{at}"
            sealer = _sealing.Sealer(_sealing.current(), where)
            plain = _sealable(plain, root, lambda: sealer.plain(value, plain, root))
    if whole:
        plain = _sealable(plain, root, lambda: _sealed_whole(plain, root, at, whole))
    try:
        text = _encoder.encode(plain)
    except (ValueError, RecursionError) as exc:  # NaN / Infinity, a cycle, too deep
        _refuse_if_found(plain, root, raw=False)
        raise SerialisationError(f"{root} cannot be stored as JSON: {exc}", path=root) from exc
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate, in a value or a key
            _refuse_if_found(plain, root, raw=False)
            raise SerialisationError(  # pragma: no cover - the walk finds every surrogate
                f"{root} holds a lone surrogate UTF-8 cannot encode", path=root
            ) from exc
    return text


def _sealable(plain: Any, root: str, seal: Callable[[], Any]) -> Any:
    """``seal()``, which encodes what it seals before the checks in ``_encode``: a NaN or a
    lone surrogate there is refused as they refuse it (R9.5), not as the encoder's error."""
    try:
        return seal()
    except (ValueError, UnicodeError, RecursionError) as exc:
        _refuse_if_found(plain, root, raw=False)
        raise SerialisationError(f"{root} cannot be stored as JSON: {exc}", path=root) from exc


def _sealed_whole(plain: Any, root: str, at: str | None, whole: bool | str) -> Any:
    """``plain`` sealed as one value, or (``whole`` a key) its member ``whole`` alone. A value
    that is an envelope already (a ``SecretStr``) is left as it is: sealing it twice would cost
    a second seal and gain nothing."""
    sealer = _sealing.Sealer(_sealing.current(), root if at is None else f"{root}:{at}")
    path, target = root, plain
    if isinstance(whole, str):
        if not isinstance(plain, dict) or whole not in plain:
            return plain
        path, target = f"{root}.{whole}", plain[whole]
    if isinstance(target, dict) and _sealing.MARK in target:
        return plain
    # Only a bare string is remembered for scrubbing: a whole state's words would mask any.
    sealed = sealer.whole(target, path, remember=isinstance(target, str))
    return {**plain, whole: sealed} if isinstance(whole, str) else sealed


def loads(
    text: str, *, root: str | None = None, at: str | None = None, instance: str | None = None
) -> Any:
    """Decode a stored payload. Stored payloads are trusted: they were written by ``dumps``.

    With ``root`` (and ``at``) as it was written, and inside ``sealing(...)``, sealed members
    are opened for the flow's own code; otherwise they stay sealed envelopes (``masked``
    shows them as ``**********``). ``instance`` reads another instance's value (a child's
    result)."""
    value = json.loads(text)
    if root is None or _sealing.MARK not in text:
        return value
    active = _sealing.current()
    if active is None:
        raise SerialisationError(
            f"{root} holds sealed members and this node has no encryption keys; configure "
            "encryption_keys (FLOWX_ENCRYPTION_KEYS) with the keys they were written under",
            code="keys.missing",
            path=root,
        )
    where = root if at is None else f"{root}:{at}"
    return _sealing.open_sealed(value, active, where, root, instance)


def validate_model(
    model: type[M], text: str, *, root: str, at: str | None = None, instance: str | None = None
) -> M:
    """``text`` read back as ``model``, its sealed members opened (``loads``)."""
    if _sealing.MARK not in text:
        return model.model_validate_json(text)
    return model.model_validate(loads(text, root=root, at=at, instance=instance))


def validate_as(adapter: TypeAdapter[T], text: str, *, root: str, at: str | None = None) -> T:
    """``text`` read back through ``adapter``, its sealed members opened (``loads``)."""
    if _sealing.MARK not in text:
        return adapter.validate_json(text)
    return adapter.validate_python(loads(text, root=root, at=at))


def text(value: str, *, root: str, code: str | None = None, context: str | None = None) -> str:
    """``value``, checked for a text column (an idempotency key, a partition key, a signal
    key): a lone surrogate cannot be encoded, and PostgreSQL ``text`` cannot hold NUL (R9.5).
    ``code`` and ``context`` as for ``dumps``."""
    if context is None:
        return _text(value, root)
    try:
        return _text(value, root)
    except SerialisationError as exc:
        raise refused(exc, context, code or exc.code) from exc


def _text(value: str, root: str) -> str:
    if not isinstance(value, str):  # a key typed as str by the caller's annotations only
        raise SerialisationError(f"{root} must be a str, not {type(value).__name__}", path=root)
    if "\x00" in value:
        raise SerialisationError(
            f"{root} {value!r} holds a NUL character at index {value.index(chr(0))}, which "
            "PostgreSQL text cannot store; remove it",
            path=root,
        )
    at = _surrogate_at(value)
    if at is not None:
        raise SerialisationError(f"{root} {_surrogate_problem(value, at)}", path=root)
    return value


def refused(exc: SerialisationError, context: str, code: str) -> SerialisationError:
    """``exc`` said from where it happened: ``step 'x': the result of cap@1 cannot be stored:
    ...``, with the caller's error ``code`` (``step.result_unstorable``) and the same path."""
    return SerialisationError(f"{context} cannot be stored: {exc}", code=code, path=exc.path)


def printable(message: str) -> str:
    """``message`` with lone surrogates escaped, so an error message quoting an unstorable
    value can itself be stored (a failure row's payload must always be storable)."""
    if message.isascii():
        return message
    return message.encode("utf-8", "backslashreplace").decode("utf-8")


# -- the fast scan -------------------------------------------------------------------------


def _scan(value: Any) -> int:
    """``_PLAIN`` when ``value`` is nothing but plain JSON containers and scalars (encode it
    as it is), ``_HAS_DECLARED`` when it also holds models, datetimes ... (pydantic converts
    them), ``_HAS_LOOSE`` when one of those has a field typed ``Any`` (checked raw),
    ``_SUSPECT`` when it holds anything else, to be judged by the walk that names it.
    No paths are built: this runs on every step commit."""
    if type(value) in _SCALARS:
        return _PLAIN
    stack = [value]
    declared = loose = False
    budget = _SCAN_BUDGET
    scalars = _SCALARS
    while stack:
        v = stack.pop()
        t = type(v)
        if t in scalars:
            continue
        budget -= 1
        if budget < 0:
            return _SUSPECT
        if t is dict:
            for k in v:
                if type(k) is not str:
                    return _SUSPECT
            stack.extend(v.values())
        elif t is list or t is tuple:
            stack.extend(v)
        elif isinstance(v, _DECLARED) or _is_dataclass_instance(v):
            declared = True
            cls: type = t
            if not loose and _has_fields(cls) and _has_loose_fields(cls):
                loose = True
        else:
            return _SUSPECT
    if loose:
        return _HAS_LOOSE
    return _HAS_DECLARED if declared else _PLAIN


def _is_dataclass_instance(v: Any) -> bool:
    return dataclasses.is_dataclass(v) and not isinstance(v, type)


# -- the walk that names the field (errors only) -------------------------------------------


def _refuse_if_found(value: Any, root: str, *, raw: bool) -> None:
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
        at = _surrogate_at(v)
        return None if at is None else _surrogate_problem(v, at)
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
                    f"would be stored as {_key_text(k)!r} and read back as a str; use str "
                    "keys, or a pydantic model that declares the key type"
                )
            at = _surrogate_at(k)
            if at is not None:
                return f"has the key {k!r}, which {_surrogate_problem(k, at)}"
            path.append(_field(k))
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
    if isinstance(v, _DECLARED) or _is_dataclass_instance(v):
        return None  # its own serialiser is the contract; its output is checked after
    if isinstance(v, Iterator):
        return (
            f"is a {kind}: storing it would consume it, and the value would be lost; return a list"
        )
    try:
        to_jsonable_python(v)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        return f"({kind}) has no JSON form ({exc}); {_WHAT_TO_DO}"
    return None


# -- fields typed Any ----------------------------------------------------------------------
#
# pydantic serialises a model or dataclass field declared ``Any`` (or ``object``, or a model's
# extra field) by looking at the value: NaN becomes null (in a model), bytes become text, a
# set a list, an int key a str key. No declared type reads it back, so that would change
# stored data; such a field is checked as a raw value instead. Classes without one are not
# walked (known per class, cached): this runs on every step commit.


def _refuse_if_loose(value: Any, root: str) -> None:
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
    if isinstance(v, BaseModel) or _is_dataclass_instance(v):
        cls: type = type(v)
        if not _has_loose_fields(cls):
            return None
        parts: list[tuple[str, Any, Any]] = [
            (name, getattr(v, name, None), declared) for name, declared in _loose_fields(cls)
        ]
        if isinstance(v, BaseModel):
            parts += [(str(k), item, Any) for k, item in (v.__pydantic_extra__ or {}).items()]
        for name, item, declared in parts:
            path.append(_field(name))
            found = _loose_problem(item, path, depth + 1, declared)
            if found is not None:
                return found
            path.pop()
        return None
    if isinstance(v, dict):
        inner = _inner(annotation, dict)
        scalars_ok = not _is_loose(inner)  # else each value is checked raw, below
        for k, item in v.items():
            if scalars_ok and type(item) in _SCALARS:
                continue
            path.append(_field(k) if isinstance(k, str) else f"[{k!r}]")
            found = _loose_problem(item, path, depth + 1, inner)
            if found is not None:
                return found
            path.pop()
    elif isinstance(v, list | tuple):
        inner = _inner(annotation, list)
        scalars_ok = not _is_loose(inner)
        for index, item in enumerate(v):
            if scalars_ok and type(item) in _SCALARS:
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
        if _has_fields(a):
            if _has_loose_fields(a):
                return True
            continue
        stack.extend(typing.get_args(a))
    return False


def _extra_allowed(cls: type) -> bool:
    return issubclass(cls, BaseModel) and cls.model_config.get("extra") == "allow"


def _has_fields(cls: object) -> bool:
    return isinstance(cls, type) and (issubclass(cls, BaseModel) or dataclasses.is_dataclass(cls))


@functools.cache
def _has_loose_fields(cls: type) -> bool:
    """Whether a ``cls`` value (a model or a dataclass) can hold a part no declared type
    covers (cached per class)."""
    seen: set[object] = set()
    stack: list[Any] = [cls]
    while stack:
        annotation = stack.pop()
        if _is_loose(annotation) or (_has_fields(annotation) and _extra_allowed(annotation)):
            return True
        if _has_fields(annotation):
            if annotation not in seen:
                seen.add(annotation)
                stack.extend(declared for _, declared in _declared_fields(annotation))
            continue
        stack.extend(typing.get_args(annotation))
    return False


def _is_loose(annotation: Any) -> bool:
    """``Any``, ``object`` or no annotation at all: pydantic guesses how to serialise it."""
    return annotation is Any or annotation is object or annotation is None


def _surrogate_at(s: str) -> int | None:
    if s.isascii():
        return None
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _surrogate_problem(s: str, at: int) -> str:
    return (
        f"holds a lone surrogate {s[at]!r} at index {at}, which UTF-8 (and so the journal) "
        "cannot store; it usually comes from bytes decoded with errors='surrogateescape' or "
        "from half of a \\uXXXX pair: decode strictly, or replace it before storing"
    )


def _field(key: str) -> str:
    return f".{key}" if key.isidentifier() else f"[{key!r}]"


def _key_text(key: Any) -> str:
    """The string a non-str key would have been stored as, had it been converted quietly."""
    try:
        return str(next(iter(to_jsonable_python({key: 0}))))
    except (PydanticSerializationError, TypeError, ValueError):
        return str(key)
