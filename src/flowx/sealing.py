"""Sensitive members, sealed at rest (R9.8).

A field is *sensitive* when its type is pydantic's ``SecretStr`` or ``SecretBytes``, or when it
is declared ``flowx.Sensitive[T]``. Pydantic serialises a secret as ``"**********"``, so a
journal that stored what pydantic prints would lose the card number it was given, and one that
stored the value in clear would put it in every backup. FlowX does neither: the codec replaces
each sensitive member by a *sealed envelope*, AES-256-GCM under a key from settings, and opens
it again when the value is read back for the flow's own code. Everything that only *shows*
values (``flowx show``, the API, the UI, logs) reads the journal without the keys and sees
``**********``.

An envelope names its key (``k``), so keys rotate: new writes use the current key, older rows
stay readable while their key is still configured. Its associated data binds the instance,
where the value lives (``input``, ``state``, a step's ``result``, a ``signal``) and the member's
path, so a ciphertext copied to another instance or another field does not open.

A flow that declares sensitive members is refused when the host has no keys
(``FLOWX1028``), rather than storing the value masked or in clear.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import json
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, TypeVar

from pydantic import BaseModel, SecretBytes, SecretStr
from pydantic_core import to_jsonable_python
from typing_extensions import is_typeddict  # the typing one misses typing_extensions.TypedDict

from flowx.errors import SerialisationError
from flowx.keyring import MARK as MARK
from flowx.keyring import Keyring as Keyring
from flowx.keyring import KeysError as KeysError
from flowx.keyring import generate_key as generate_key
from flowx.masked_secrets import MASK as MASK
from flowx.masked_secrets import refusal

T = TypeVar("T")


class SensitiveMark:
    """The ``Annotated`` marker behind ``flowx.Sensitive[T]``."""

    def __repr__(self) -> str:
        return "flowx.Sensitive"


SENSITIVE: Final = SensitiveMark()

#: ``flowx.Sensitive[str]``: a member stored sealed and shown masked, of any JSON type.
Sensitive = Annotated[T, SENSITIVE]


@dataclass
class Sealing:
    """Sealing for one instance: its keys, its id, and the secrets seen, so an error message
    that quotes one can be scrubbed before it is stored or logged."""

    keyring: Keyring
    instance_id: str
    seen: set[str] = field(default_factory=set)

    def aad(self, where: str, path: str, instance_id: str | None = None) -> str:
        return f"{instance_id or self.instance_id}\x1f{where}\x1f{path}"

    def scrub(self, text: str) -> str:
        for secret in sorted(self.seen, key=len, reverse=True):
            text = text.replace(secret, MASK)
        return text

    def remember(self, secret: str) -> None:
        if len(secret) >= 4:  # a shorter one would mask ordinary words
            self.seen.add(secret)


# -- which members are sensitive ----------------------------------------------------------

#: How a member is stored: sealed as text, as bytes, as JSON; kept though ``exclude=True``.
SEAL_STR, SEAL_BYTES, SEAL_JSON = "s", "b", "j"


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    key: str
    seal: str | None  # SEAL_* or None
    excluded: bool


def _is_sensitive(annotation: Any, metadata: Iterable[Any]) -> str | None:
    if any(isinstance(m, SensitiveMark) for m in metadata) or _marked(annotation, set()):
        return SEAL_JSON
    for arg in _flatten(annotation):
        if arg is SecretStr:
            return SEAL_STR
        if arg is SecretBytes:
            return SEAL_BYTES
    return None


def _marked(annotation: Any, seen: set[Any]) -> bool:
    """Whether ``annotation`` carries the ``Sensitive`` mark below its top level, outside any
    model it names: ``Sensitive[str] | None``, ``list[Sensitive[str]]``,
    ``dict[str, Sensitive[int]]``, a dataclass or ``TypedDict`` with a marked field. The mark
    lives in the type, not in the value, so the walk over a value could not find such an
    element again: the whole member is sealed instead, which seals at least what was marked
    (an absent ``None`` stays ``None``)."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        base, *meta = typing.get_args(annotation)
        return any(isinstance(m, SensitiveMark) for m in meta) or _marked(base, seen)
    if origin is not None and origin is not typing.Literal:
        return any(_marked(arg, seen) for arg in typing.get_args(annotation))
    return any(_marked(hint, seen) for hint in _plain_fields(annotation, seen))


def _plain_fields(tp: Any, seen: set[Any]) -> list[Any]:
    """The field types of a dataclass or a ``TypedDict`` (pydantic validates both, and the
    value walk does not enter them), each class once; none for anything else."""
    if not isinstance(tp, type) or not (dataclasses.is_dataclass(tp) or is_typeddict(tp)):
        return []
    if tp in seen:
        return []
    seen.add(tp)
    try:
        return list(typing.get_type_hints(tp, include_extras=True).values())
    except Exception:  # an unresolvable forward reference: pydantic has refused it already
        return []


def _flatten(annotation: Any) -> list[Any]:
    """The types an annotation names at its top level (``X | None`` names ``X``)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return [a for arg in typing.get_args(annotation) for a in _flatten(arg)]
    if origin is Annotated:
        return _flatten(typing.get_args(annotation)[0])
    return [annotation]


@functools.cache
def members(cls: type[BaseModel]) -> tuple[Member, ...]:
    """The members of ``cls`` the codec must treat specially: sensitive ones (sealed) and
    ``exclude=True`` ones (stored anyway: the journal keeps what the flow's code needs)."""
    found = []
    for name, info in cls.model_fields.items():
        seal = _is_sensitive(info.annotation, info.metadata)
        excluded = bool(info.exclude)
        if seal or excluded:
            key = info.serialization_alias or info.alias or name
            found.append(Member(name=name, key=key, seal=seal, excluded=excluded))
    return tuple(found)


@functools.cache
def sealed_fields(cls: type[BaseModel]) -> frozenset[str]:
    """The fields of ``cls`` (by name) that are sealed, or whose declared type can hold a
    sealed member at some depth (``list[SecretStr]``, a model with a secret): a value bound
    for one is sensitive wherever else it is kept, a step's result row first of all — which
    may hold it in another shape (a plain ``str`` where the field holds a ``SecretStr``)."""
    sealed = {m.name for m in members(cls) if m.seal}
    return frozenset(
        name
        for name, info in cls.model_fields.items()
        if name in sealed or declares_sensitive(info.annotation)
    )


def declares_sensitive(tp: Any) -> bool:
    """Whether values of type ``tp`` can hold a sensitive member at any depth."""
    return _reaches(tp, lambda cls: any(m.seal for m in members(cls)), set())


def _reaches(tp: Any, special: Callable[[type[BaseModel]], bool], seen: set[Any]) -> bool:
    """Whether values of type ``tp`` can hold, at any depth, a secret type, a member marked
    ``Sensitive``, or a model ``special`` says yes to: the one walk over annotations that
    registration (``declares_sensitive``) and the sealer (``_nested``) share."""
    try:
        if tp in seen:
            return False
        seen.add(tp)
    except TypeError:  # an unhashable annotation argument (a constraint object): no type
        return False
    if tp is SecretStr or tp is SecretBytes:
        return True
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *meta = typing.get_args(tp)
        return any(isinstance(m, SensitiveMark) for m in meta) or _reaches(base, special, seen)
    if origin is not None:
        return any(_reaches(arg, special, seen) for arg in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return special(tp) or any(
            _reaches(info.annotation, special, seen) for info in tp.model_fields.values()
        )
    return any(_reaches(hint, special, seen) for hint in _plain_fields(tp, set()))


# -- the instance being sealed for: a context variable ----------------------------------

_SEALING: contextvars.ContextVar[Sealing | None] = contextvars.ContextVar(
    "flowx_sealing", default=None
)


class sealing:
    """Seal and open sensitive members as ``active`` (one instance's keys) says, in this
    context and the tasks it starts; ``None`` leaves values as they are. A class, not a
    generator: it is entered on every start and run, and costs nothing without keys."""

    __slots__ = ("_active", "_token")

    def __init__(self, active: Sealing | None) -> None:
        self._active = active
        self._token: contextvars.Token[Sealing | None] | None = None

    def __enter__(self) -> Sealing | None:
        if self._active is not None or _SEALING.get() is not None:
            self._token = _SEALING.set(self._active)
        return self._active

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _SEALING.reset(self._token)


def current() -> Sealing | None:
    """The sealing of the instance this code runs for, if any."""
    return _SEALING.get()


def scrub(text: str) -> str:
    """``text`` with every secret this instance has sealed or opened masked: an error
    message that quotes a card number is stored and logged without it (R9.8)."""
    active = _SEALING.get()
    return text if active is None or not active.seen else active.scrub(text)


# -- the walks: seal, open, mask, redact ----------------------------------------------------


def _canonical(data: Any) -> str:
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def _texts(data: Any) -> Iterator[str]:
    """Every string in a member's JSON form (a list of sensitive strings is sealed whole):
    each is remembered, so an error message quoting one is scrubbed."""
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict):
        if MARK in data:  # sealed already: its ciphertext is no secret
            return
        for item in data.values():
            yield from _texts(item)
    elif isinstance(data, list):
        for item in data:
            yield from _texts(item)


def masked(value: Any) -> Any:
    """``value`` with every sealed envelope shown as ``**********``: what displays show."""
    if isinstance(value, dict):
        if MARK in value:
            return MASK
        return {k: masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def open_sealed(value: Any, active: Sealing, where: str, path: str, instance: str | None) -> Any:
    if isinstance(value, dict):
        if MARK in value:
            raw = active.keyring.open(value, active.aad(where, path, instance))
            kind = value.get("t")
            if kind == SEAL_BYTES:
                return raw
            opened = raw.decode("utf-8")
            if kind == SEAL_STR:
                active.remember(opened)
                return opened
            member = json.loads(opened)
            for text in _texts(member):
                active.remember(text)
            # Sealed whole, it may hold members sealed on their own (a ``SecretStr`` in it)
            return open_sealed(member, active, where, path, instance)
        return {k: open_sealed(v, active, where, f"{path}.{k}", instance) for k, v in value.items()}
    if isinstance(value, list):
        return [
            open_sealed(v, active, where, f"{path}[{i}]", instance) for i, v in enumerate(value)
        ]
    return value


#: Model classes with nothing to seal or keep at any depth: the codec skips the walk for them
#: (one set lookup on the step commit's path instead of a walk).
PLAIN_MODELS: set[type] = set()


class Sealer:
    """Puts each sensitive member of ``value`` into its plain JSON form ``plain``, sealed,
    and each ``exclude=True`` member, which pydantic leaves out (the flow's code needs it
    when the instance resumes). Walks only models and the containers around them."""

    __slots__ = ("active", "sealed", "where")
    #: The journal keeps ``exclude=True`` members; an event leaves them out as pydantic does.
    keeps_excluded = True

    def __init__(self, active: Sealing | None, where: str) -> None:
        self.active = active
        self.where = where
        #: The ``id`` of each secret sealed, once per place: a mask the codec cannot follow
        #: back is a lost secret only if some secret was not sealed (``masked_secrets``).
        self.sealed: list[int] = []

    def plain(self, value: Any, plain: Any, path: str) -> Any:
        if isinstance(value, SecretStr | SecretBytes):
            self.sealed.append(id(value))
            secret = value.get_secret_value()
            if isinstance(secret, str):
                return self.seal(secret.encode(), SEAL_STR, path, secret)
            return self.seal(secret, SEAL_BYTES, path, None)
        if isinstance(value, BaseModel):
            return self.model(value, plain, path)
        if isinstance(value, list | tuple) and isinstance(plain, list):
            if not _any_walked(value):
                return plain
            pairs = enumerate(zip(value, plain, strict=True))
            return [self.plain(v, p, f"{path}[{i}]") for i, (v, p) in pairs]
        if isinstance(value, dict) and isinstance(plain, dict):
            if not _any_walked(value.values()):
                return plain
            return {
                k: self.plain(value[k], p, f"{path}.{k}") if k in value else p
                for k, p in plain.items()
            }
        if isinstance(plain, dict) and _dataclass_fields(type(value)):
            return self.dataclass(value, plain, path)
        return plain

    def dataclass(self, value: Any, plain: dict[str, Any], path: str) -> Any:
        """A dataclass's fields, walked as a model's members are: pydantic's form of one
        holds ``"**********"`` for a ``SecretStr`` in it, and the secret would be lost."""
        out = dict(plain)
        for name, key, seal in _dataclass_fields(type(value)):
            if key not in out:
                continue
            v = getattr(value, name, None)
            if v is None:
                continue
            where = f"{path}.{key}"
            start = len(self.sealed)
            out[key] = self.plain(v, out[key], where)
            if seal == SEAL_JSON:  # marked below its top level: sealed whole, as a member
                out[key] = self.whole(out[key], where, value=v, sealed=self.sealed[start:])
        return out

    def model(self, value: BaseModel, plain: Any, path: str) -> Any:
        cls = type(value)
        special = members(cls)
        nested = _nested(cls)
        if not (special or nested):
            PLAIN_MODELS.add(cls)
            return plain
        if not isinstance(plain, dict):
            return plain
        out = dict(plain)
        for m in special:
            if m.excluded and not self.keeps_excluded:
                continue
            v = getattr(value, m.name)
            if m.excluded and m.seal is None:
                out[m.key] = self.plain(v, to_jsonable_python(v), f"{path}.{m.key}")
            elif m.seal is not None and v is not None:
                out[m.key] = self.member(m, v, f"{path}.{m.key}")
        for name, key in nested:
            if key in out:
                out[key] = self.plain(getattr(value, name), out[key], f"{path}.{key}")
        return out

    def member(self, m: Member, v: Any, path: str) -> dict[str, str]:
        if m.seal == SEAL_JSON:
            # Its JSON form with any secret in it sealed first: pydantic's own form would
            # hold ``"**********"`` for a ``SecretStr``, and the value would be lost.
            start = len(self.sealed)
            inner = self.plain(v, to_jsonable_python(v), path)
            return self.whole(inner, path, value=v, sealed=self.sealed[start:])
        return self.plain(v, None, path)  # type: ignore[no-any-return]

    def whole(
        self,
        plain: Any,
        path: str,
        *,
        remember: bool = True,
        value: Any = None,
        sealed: Sequence[int] = (),
    ) -> dict[str, str]:
        """``plain`` (``value``'s JSON form) sealed as one value: a member marked below its
        top level, or a step's result bound for a sealed state field
        (``codec.dumps(whole=...)``). ``remember``: its strings are scrubbed from the
        instance's error messages. A secret pydantic wrote as its mask inside it is refused,
        as outside (``flowx.masked_secrets``): sealed, the mask would be lost unseen.
        ``sealed``: the secrets of ``value`` sealed into ``plain`` on the way here (by id),
        so a mask that leads nowhere beside them is not taken for one of them."""
        text = _canonical(plain)
        if MASK in text:
            lost = refusal(value, plain, path, sealed)
            if lost is not None:
                raise SerialisationError(lost[1], path=lost[0])
        if self.active is not None and remember:  # without keys, ``seal`` refuses it below
            for member in _texts(plain):
                self.active.remember(member)
        return self.seal(text.encode(), SEAL_JSON, path, None)

    def seal(self, data: bytes, kind: str, path: str, secret: str | None) -> dict[str, str]:
        active = self.active
        if active is None:
            raise SerialisationError(
                f"{path} is sensitive and this node has no encryption keys to seal it; "
                "configure encryption_keys (FLOWX_ENCRYPTION_KEYS; `flowx keys generate`)",
                code="keys.missing",
                path=path,
            )
        if secret is not None:
            active.remember(secret)
        return active.keyring.seal(data, kind, active.aad(self.where, path))


class _Redactor(Sealer):
    """The sealer's walk, with each sensitive member replaced by a mark instead."""

    __slots__ = ("mark",)
    keeps_excluded = False

    def __init__(self, mark: str) -> None:
        super().__init__(None, "")
        self.mark = mark

    def member(self, m: Member, v: Any, path: str) -> Any:
        return self.mark

    def whole(
        self,
        plain: Any,
        path: str,
        *,
        remember: bool = True,
        value: Any = None,
        sealed: Sequence[int] = (),
    ) -> Any:
        return self.mark

    def seal(self, data: bytes, kind: str, path: str, secret: str | None) -> Any:
        return self.mark


def redacted(value: Any, plain: Any, mark: str) -> Any:
    """``plain`` (``value``'s JSON form) with each sensitive member of ``value``, at every
    depth, replaced by ``mark``: what leaves the journal for a broker (R5.1)."""
    return _Redactor(mark).plain(value, plain, "event")


_WALKED: Final = (BaseModel, SecretStr, SecretBytes, list, tuple, dict)


def _any_walked(values: Iterable[Any]) -> bool:
    """Whether the sealer's walk must look inside (or at) any of ``values``: a type check
    per value, then one dict lookup per value of another class (a dataclass, a datetime)."""
    known = _DATACLASSES
    for v in values:
        cls = type(v)
        if cls in _LEAVES:
            continue
        if isinstance(v, _WALKED):
            return True
        found = known.get(cls)
        if found is None:
            found = _dataclass_fields(cls)
        if found:
            return True
    return False


#: Values the walk never looks into.
_LEAVES: Final = frozenset({str, int, float, bool, type(None)})


DataclassField = tuple[str, str, str | None]
#: Per class, what ``_dataclass_members`` says of it: ``()`` for any class that is not a
#: dataclass or has nothing to seal (one dict lookup per value walked).
_DATACLASSES: dict[type, tuple[DataclassField, ...]] = {}


def _dataclass_fields(cls: type) -> tuple[DataclassField, ...]:
    found = _DATACLASSES.get(cls)
    if found is None:
        found = _dataclass_members(cls) if dataclasses.is_dataclass(cls) else ()
        _DATACLASSES[cls] = found
    return found


def _dataclass_members(cls: Any) -> tuple[DataclassField, ...]:
    """The fields of dataclass ``cls`` the sealer must look at — by name, stored key (a
    pydantic dataclass's alias) and ``SEAL_JSON`` when marked ``Sensitive`` (sealed whole),
    else ``None`` (walked: a secret type, a model or a container that can hold one); none for
    a dataclass with nothing to seal. Where its annotations cannot be resolved, every field is
    walked: the walk still finds each secret by its value."""
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # e.g. a forward reference to a class local to a function
        hints = None
    infos = getattr(cls, "__pydantic_fields__", None) or {}
    found: list[DataclassField] = []
    for f in dataclasses.fields(cls):
        info = infos.get(f.name)
        key = (info.serialization_alias or info.alias or f.name) if info else f.name
        if hints is None or f.name not in hints:
            found.append((f.name, key, None))
            continue
        seal = _is_sensitive(hints[f.name], ())
        if seal == SEAL_JSON:
            found.append((f.name, key, seal))
        elif seal is not None or _reaches(hints[f.name], lambda c: bool(members(c)), set()):
            found.append((f.name, key, None))
    return tuple(found)


@functools.cache
def _nested(cls: type[BaseModel]) -> tuple[tuple[str, str], ...]:
    """The fields of ``cls`` (by name and stored key) whose declared type can hold a model
    with special members: the only ones the sealer descends into."""
    found = []
    sealed = {m.name for m in members(cls) if m.seal}
    for name, info in cls.model_fields.items():
        if name in sealed:  # sealed whole: nothing inside it is walked
            continue
        if _reaches(info.annotation, lambda c: bool(members(c)), set()):
            found.append((name, info.serialization_alias or info.alias or name))
    return tuple(found)
