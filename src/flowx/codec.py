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

import json
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from pydantic import BaseModel, TypeAdapter
from pydantic_core import PydanticSerializationError, to_jsonable_python

from flowx import sealing as _sealing
from flowx.codec_checks import (
    DECLARED,
    SCALARS,
    WHAT_TO_DO,
    has_fields,
    has_loose_fields,
    is_dataclass_instance,
    refuse_if_found,
    refuse_if_loose,
    surrogate_at,
    surrogate_problem,
)
from flowx.codec_checks import MAX_DEPTH as MAX_DEPTH
from flowx.errors import SerialisationError
from flowx.masked_secrets import MASK, refusal
from flowx.sealing import scrub as scrub
from flowx.sealing import sealing as sealing

CODEC_VERSION = 1

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

_encoder = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False
)


def _no_json_form(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


#: ``_encoder`` made once: ``JSONEncoder.encode`` builds this same C encoder on every call,
#: which costs more than encoding a small step result (it is 2 or 3 encodes per step
#: commit). The same settings, so the same bytes; without the circular-reference markers
#: (a cycle ends as a ``RecursionError``, refused like the ``ValueError`` it was), so one
#: encoder holds no per-call state and serves every caller at once.
_make_c_encoder = getattr(json.encoder, "c_make_encoder", None)
_c_encode: Callable[[Any, int], Any] | None = (
    _make_c_encoder(
        None, _no_json_form, json.encoder.encode_basestring, None, ":", ",", True, False, False
    )
    if _make_c_encoder is not None
    else None
)


def _to_text(plain: Any) -> str:
    """``plain`` as canonical JSON text: ``_encoder.encode``, through the prebuilt encoder
    when this Python has the C one."""
    if _c_encode is None or type(plain) is str:
        return _encoder.encode(plain)
    return "".join(_c_encode(plain, 0))


#: Below this magnitude an ``int`` is encoded as its ``repr``, as the encoder would (a longer
#: one goes the usual way, which refuses what ``sys.set_int_max_str_digits`` forbids).
_SHORT_INT: Final = 10**18

#: Model and dataclass classes with no loose field at any depth: a value of one, scanned on
#: its own, is ``_HAS_DECLARED`` whatever it holds (the scan does not look inside a model).
_TIGHT: set[type] = set()

#: Containers the fast scan looks at before handing over to the walk that names fields; it
#: also bounds the scan of a value that contains itself.
_SCAN_BUDGET: Final = 100_000

#: What ``_scan`` found: plain JSON values only; declared types too; a model or dataclass
#: with a field typed ``Any`` as well; something else (judged by the walk).
_PLAIN, _HAS_DECLARED, _HAS_LOOSE, _SUSPECT = 0, 1, 2, 3


def to_json_value(value: Any) -> Any:
    """Turn a pydantic model, dataclass, datetime, UUID, ... into plain JSON values."""
    try:
        return to_jsonable_python(value)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise SerialisationError(
            f"{type(value).__name__} has no JSON form ({exc}); {WHAT_TO_DO}"
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
    if type(value) is int and not whole and -_SHORT_INT < value < _SHORT_INT:
        return int.__repr__(value)  # a step's usual result: the text the encoder writes
    kind = _scan(value)
    sealed: list[int] | tuple[()] = ()  # the secrets a sealer sealed into ``plain``
    if kind == _PLAIN:
        plain = value
    else:
        if kind == _SUSPECT:
            refuse_if_found(value, root, raw=True)
        if kind != _HAS_DECLARED:
            refuse_if_loose(value, root)
        try:
            plain = to_jsonable_python(value)
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            raise SerialisationError(
                f"{root} ({type(value).__name__}) has no JSON form ({exc}); {WHAT_TO_DO}",
                path=root,
            ) from exc
        if type(value) not in _sealing.PLAIN_MODELS:  # the step commit's usual case: skipped
            where = root if at is None else f"{root}:{at}"
            sealer = _sealing.Sealer(_sealing.current(), where)
            plain = _sealable(plain, root, lambda: sealer.plain(value, plain, root))
            sealed = sealer.sealed
    if whole:
        plain = _sealable(plain, root, lambda: _sealed_whole(value, plain, root, at, whole, sealed))
    try:
        text = _to_text(plain)
    except (ValueError, RecursionError) as exc:  # NaN / Infinity, a cycle, too deep
        refuse_if_found(plain, root, raw=False)
        raise SerialisationError(f"{root} cannot be stored as JSON: {exc}", path=root) from exc
    if kind != _PLAIN and MASK in text:  # only models and the like produce the mask
        lost = refusal(value, plain, root, sealed)
        if lost is not None:
            raise SerialisationError(lost[1], path=lost[0])
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate, in a value or a key
            refuse_if_found(plain, root, raw=False)
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
        refuse_if_found(plain, root, raw=False)
        raise SerialisationError(f"{root} cannot be stored as JSON: {exc}", path=root) from exc


def _sealed_whole(
    value: Any,
    plain: Any,
    root: str,
    at: str | None,
    whole: bool | str,
    sealed: Sequence[int],
) -> Any:
    """``plain`` sealed as one value, or (``whole`` a key) its member ``whole`` alone. A value
    that is an envelope already (a ``SecretStr``) is left as it is: sealing it twice would cost
    a second seal and gain nothing. ``sealed``: the secrets already sealed into ``plain``."""
    sealer = _sealing.Sealer(_sealing.current(), root if at is None else f"{root}:{at}")
    path, target, part = root, plain, value
    if isinstance(whole, str):
        if not isinstance(plain, dict) or whole not in plain:
            return plain
        path, target = f"{root}.{whole}", plain[whole]
        part = value.get(whole) if isinstance(value, dict) else None
    if isinstance(target, dict) and _sealing.MARK in target:
        return plain
    # Only a bare string is remembered for scrubbing: a whole state's words would mask any.
    done = sealer.whole(target, path, remember=isinstance(target, str), value=part, sealed=sealed)
    return {**plain, whole: done} if isinstance(whole, str) else done


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
    at = surrogate_at(value)
    if at is not None:
        raise SerialisationError(f"{root} {surrogate_problem(value, at)}", path=root)
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
    root = type(value)
    if root in SCALARS:
        return _PLAIN
    if root in _TIGHT:  # the state, on every step commit: what the walk below found before
        return _HAS_DECLARED
    stack = [value]
    declared = loose = False
    budget = _SCAN_BUDGET
    scalars = SCALARS
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
        elif isinstance(v, DECLARED) or is_dataclass_instance(v):
            declared = True
            cls: type = t
            if not loose and has_fields(cls):
                if has_loose_fields(cls):
                    loose = True
                elif v is value:  # a model alone is declared whatever it holds: remembered
                    _TIGHT.add(cls)
        else:
            return _SUSPECT
    if loose:
        return _HAS_LOOSE
    return _HAS_DECLARED if declared else _PLAIN
