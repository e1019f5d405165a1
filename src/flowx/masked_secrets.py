"""Secrets pydantic would store as ``"**********"``: found, so the value is refused, not lost.

A ``SecretStr`` is sealed where a declared type says one can be (``flowx.sealing``). Where none
does — a field typed ``Any``, a ``dict`` or ``list`` declared without element types, a ``set``
or a ``deque``, a model's extra field, a dict keyed by something else than ``str``, a
``pydantic.Secret[T]`` (which has no sealed form) — pydantic's serialiser writes its mask in
the secret's place, and the journal would keep the mask: the secret lost without a word, read
back as ten asterisks. That is silently changed data, so the codec refuses it (R9.5, R9.8),
naming where the secret is and what to declare.

What is checked is what was actually written, not what the types promise: the JSON form about
to be stored (after sealing) is searched for the mask, and each place that holds it is followed
back into the value. Only where the value there *is* a secret was one lost; a string that
merely is ``"**********"``, a secret a serialiser wrote out or left out, an empty secret
(written as ``""``) are stored as they are. A mask that leads nowhere in the value (a
serialiser of the application's moved it, a ``TypedDict`` key stored under its alias, a dict
key written by its own serialiser) cannot be told apart from a moved secret: the value is then
refused if it holds a secret that was not sealed, and stored otherwise. Each caller looks for
the mask in the text it
encoded first (one C-level substring search), so a value without it costs nothing more; the
search and the following are iterative, so no nesting makes them overflow the stack.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter, deque
from collections.abc import Collection, Iterator
from typing import Any, Final

import pydantic
from pydantic import BaseModel, RootModel, SecretBytes, SecretStr

from flowx.codec_checks import field_path, key_text

#: What pydantic writes for a secret, and what displays show for a sealed member.
MASK: Final = "**********"
#: What pydantic writes for a ``SecretBytes`` used as a dict key (its ``str``).
_BYTES_KEY: Final = f"b'{MASK}'"

#: Every pydantic secret type: ``SecretStr``, ``SecretBytes`` and the generic ``Secret[T]``.
_SECRETS: Final = (SecretStr, SecretBytes, pydantic.Secret)
#: A place in a JSON form: a dict key or a list index.
Step = str | int


def refusal(
    value: Any, plain: Any, root: str, sealed: Collection[int] = ()
) -> tuple[str, str] | None:
    """Where the first secret of ``value`` is that its JSON form ``plain`` holds as the mask
    (its path under ``root``), and why that is refused and what to do; ``None`` if none is.

    ``sealed``: the ``id`` of each secret the sealer sealed into ``plain`` (once per place).
    A mask that leads nowhere in ``value`` (a serialiser of the application's moved it, a
    ``TypedDict`` key stored under its alias, a dict key written by its own serialiser) may
    be a secret's all the same: it is refused if ``value`` holds a secret that was not
    sealed, since nothing then shows where that secret went (``_unaccounted``)."""
    follow = _Follower()
    astray: tuple[Step, ...] | None = None
    for steps, is_key in _masks(plain):
        try:
            found = follow(value, steps)
        except Exception:  # an application's property that raises: nothing to follow
            found = None
        if found is _NOT_STATE:  # a computed field: not state, never read back
            continue
        if found is None:  # a serialiser reshaped it: judged once all masks are followed
            if astray is None:
                astray = steps
            continue
        (target,) = found
        try:
            if is_key:
                lost = isinstance(target, dict) and any(_masked(k) for k in target)
            else:
                lost = _masked(target)
        except Exception:  # a secret type of the application's that fails to say its value
            lost = False
        if lost:
            return _said(root, steps, target, is_key)
    if astray is not None:
        return _unaccounted(value, root, astray, sealed)
    return None


def _unaccounted(
    value: Any, root: str, astray: tuple[Step, ...], sealed: Collection[int]
) -> tuple[str, str] | None:
    """The first secret of ``value`` that was not sealed, refused for the mask at ``astray``
    that could not be followed back: had it been written out, left out or sealed, nothing
    would say so; stored as the mask, it would be lost. ``None`` when every secret of
    ``value`` was sealed (or it holds none): the mask is then an ordinary string. A value too
    large to search is refused too: what it holds cannot be told."""
    left = Counter(sealed)
    where = _spelled_path(root, astray)
    for path, secret in _secrets(value):
        if secret is _TOO_LARGE:
            return root, (
                f"{where} holds '**********' where the value holds nothing to follow it back to "
                f"(a serialiser of the application's put it there), and {root} is too large "
                f"(over {_SECRETS_BUDGET:,} containers) to be searched for a secret it may "
                "stand for; store a secret where FlowX can seal it (a field declared SecretStr "
                "or SecretBytes, not moved by a serialiser), or another string there"
            )
        if left[id(secret)] > 0:
            left[id(secret)] -= 1
            continue
        at = root + path
        return at, (
            f"{at} holds a secret the stored form does not keep in its place: "
            f"'**********' is stored at {where} instead (put there by a serialiser of the "
            "application's, a TypedDict key's alias or a dict key's own serialiser), and the "
            "secret would be lost; keep a secret where FlowX can seal it (a field declared "
            "SecretStr or SecretBytes, stored under its own key, not moved by a serialiser), "
            "or leave it out of the stored value"
        )
    return None


#: Containers ``_secrets`` looks into before it gives up (strings and numbers are not
#: counted): it also bounds a value that contains itself.
_SECRETS_BUDGET: Final = 100_000
#: What ``_secrets`` yields, last, when its budget ran out.
_TOO_LARGE: Final = object()
#: Values ``_secrets`` never looks into or at.
_LEAVES: Final = frozenset({str, int, float, bool, type(None), bytes})


def _secrets(value: Any) -> Iterator[tuple[str, Any]]:
    """Each secret pydantic would write as the mask anywhere in ``value`` (models, their
    extra fields and private attributes, dataclasses, dicts, their keys too, lists, tuples,
    sets, deques), with its path by attribute names and keys; ``("", _TOO_LARGE)`` last if
    the budget ran out first. Plain attribute reads only: no property, computed field or
    serialiser of the application's runs."""
    stack: list[tuple[Any, str]] = [(value, "")]
    budget = _SECRETS_BUDGET
    while stack:
        v, path = stack.pop()
        if type(v) in _LEAVES:
            continue
        budget -= 1
        if budget < 0:
            yield "", _TOO_LARGE
            return
        try:
            masked = _masked(v)
        except Exception:  # a secret type of the application's that fails to say its value
            masked = False
        if masked:
            yield path, v
        elif not isinstance(v, _SECRETS):  # an empty secret is written as "": nothing lost
            stack.extend(reversed(_children(v, path)))


def _children(v: Any, path: str) -> list[tuple[Any, str]]:
    """What ``_secrets`` looks into next in ``v``, each with its path."""
    if isinstance(v, RootModel):  # its JSON form is its root's
        return [(v.root, path)]
    if isinstance(v, BaseModel):
        fields = vars(v)
        found = [(fields[n], f"{path}.{n}") for n in type(v).model_fields if n in fields]
        extra = v.__pydantic_extra__ or {}
        private = v.__pydantic_private__ or {}
        found += [(x, path + _key_step(k)) for k, x in extra.items()]
        return found + [(x, f"{path}.{k}") for k, x in private.items()]
    if isinstance(v, dict):
        found = []
        for k, x in v.items():
            found.append((x, path + _key_step(k)))
            if isinstance(k, _SECRETS):
                found.append((k, f"{path}{_key_step(k)} (the key)"))
        return found
    if isinstance(v, list | tuple | deque | set | frozenset):
        return [(x, f"{path}[{i}]") for i, x in enumerate(v)]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return [(getattr(v, f.name, None), f"{path}.{f.name}") for f in dataclasses.fields(v)]
    return []


def _key_step(key: Any) -> str:
    if isinstance(key, str):
        return field_path(key)
    return f"[{key!r}]"


def _spelled_path(root: str, steps: tuple[Step, ...]) -> str:
    return root + "".join(f"[{s}]" if isinstance(s, int) else field_path(s) for s in steps)


def _masked(value: Any) -> bool:
    """A secret pydantic writes as the mask (an empty one it writes as ``""``). Judged by
    its value, as pydantic judges it: a subclass's own ``__str__`` does not change what is
    written."""
    if isinstance(value, SecretStr | SecretBytes):
        return bool(value.get_secret_value())
    return isinstance(value, pydantic.Secret) and str(value) == MASK


def _said(root: str, steps: tuple[Step, ...], target: Any, is_key: bool) -> tuple[str, str]:
    path = _spelled_path(root, steps)
    lost = "it would be stored as '**********' and the value lost"
    if is_key:
        return path, (
            f"{path} has a secret as a key, which FlowX cannot seal: {lost}; key it by a str "
            "and keep the secret in the value"
        )
    if not isinstance(target, SecretStr | SecretBytes):
        return path, (
            f"{path} is a pydantic Secret[...], which FlowX cannot seal: {lost}; declare it "
            "SecretStr or SecretBytes"
        )
    return path, (
        f"{path} holds a secret FlowX cannot seal there: {lost}; declare its type where it "
        "sits (a SecretStr field, or a list, a dict keyed by str or a model that declares "
        "one; not Any, an untyped container, a set or a deque)"
    )


def _masks(plain: Any) -> Iterator[tuple[tuple[Step, ...], bool]]:
    """Each place in the JSON form ``plain`` that holds the mask, as the steps that reach it,
    and whether it is a dict's key (``True``) or a value. Each container is pushed with a link
    to its parent's (a pair), and a path is spelled out only for a mask found: the search
    stays linear in the size of ``plain``."""
    if type(plain) is str:
        if plain == MASK:
            yield (), False
        return
    stack: list[tuple[Any, _Link]] = [(plain, None)]
    while stack:
        node, link = stack.pop()
        if type(node) is dict:
            if MASK in node or _BYTES_KEY in node:
                yield _spelled(link), True
            pairs: Iterator[tuple[Step, Any]] = iter(node.items())
        else:
            pairs = enumerate(node)
        for step, v in pairs:
            t = type(v)
            if t is str:
                if v == MASK:
                    yield _spelled((link, step)), False
            elif t is dict or t is list:
                stack.append((v, (link, step)))


#: A path as nested pairs, ``((None, "a"), 0)`` for ``a[0]``: one pair per container pushed.
_Link = tuple[Any, Step] | None


def _spelled(link: _Link) -> tuple[Step, ...]:
    steps: list[Step] = []
    while link is not None:
        link, step = link
        steps.append(step)
    return tuple(reversed(steps))


class _Follower:
    """Follows a path of a JSON form back into the value it was made from. What a container
    costs to look into (a set listed, a dict's non-str keys written as text) is done once
    per container and kept for the call: a value with many masks is followed in linear time."""

    __slots__ = ("_keys", "_listed")

    def __init__(self) -> None:
        self._listed: dict[int, tuple[Any, list[Any]]] = {}
        self._keys: dict[int, tuple[Any, dict[str, Any]]] = {}

    def __call__(self, value: Any, steps: tuple[Step, ...]) -> tuple[Any] | None:
        """What of ``value`` its JSON form holds at ``steps``; ``None`` when a step leads
        nowhere (a serialiser of the application's wrote something of another shape)."""
        for step in steps:
            value = _unwrapped(value)
            found = self._item(value, step) if isinstance(step, int) else self._member(value, step)
            if found is None or found is _NOT_STATE:
                return found
            (value,) = found
        return (_unwrapped(value),)

    def _item(self, value: Any, index: int) -> tuple[Any] | None:
        if isinstance(value, list | tuple | deque):
            items: Any = value
        elif isinstance(value, set | frozenset):  # pydantic writes a set in iteration order
            items = self._kept(self._listed, value, lambda: list(value))
        else:
            return None
        return (items[index],) if 0 <= index < len(items) else None

    def _member(self, value: Any, key: str) -> tuple[Any] | None:
        if isinstance(value, BaseModel):
            name = _stored_fields(type(value)).get(key)
            if name is not None:
                return (getattr(value, name, None),)
            extra = value.__pydantic_extra__ or {}
            if key in extra:
                return (extra[key],)
            # A computed field is not followed: it is not state (validation ignores it when
            # the value is read back), and its code would run a second time.
            return _NOT_STATE if key in _computed_keys(type(value)) else None
        if isinstance(value, dict):
            if key in value:
                return (value[key],)
            texts = self._kept(self._keys, value, lambda: _key_texts(value))
            return (texts[key],) if key in texts else None
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            name = _stored_dataclass_fields(type(value)).get(key)
            return (getattr(value, name, None),) if name is not None else None
        return None

    @staticmethod
    def _kept(cache: dict[int, tuple[Any, Any]], value: Any, make: Any) -> Any:
        held = cache.get(id(value))
        if held is None or held[0] is not value:
            held = (value, make())
            cache[id(value)] = held
        return held[1]


def _key_texts(value: dict[Any, Any]) -> dict[str, Any]:
    """A dict's values by the text its non-str keys (ints, enums ...) are written as."""
    return {key_text(k): v for k, v in value.items() if not isinstance(k, str)}


def _unwrapped(value: Any) -> Any:
    while isinstance(value, RootModel):  # its JSON form is its root's
        value = value.root
    return value


#: What following a mask found when it led into a computed field: not state.
_NOT_STATE: Final = (None,)


@functools.cache
def _computed_keys(cls: type[BaseModel]) -> frozenset[str]:
    """The keys a model's computed fields are written under (an alias, or the name)."""
    return frozenset(info.alias or name for name, info in cls.model_computed_fields.items())


@functools.cache
def _stored_fields(cls: type[BaseModel]) -> dict[str, str]:
    """A model's fields by the key its JSON form stores each under: its serialisation alias,
    its alias, or its name (pydantic writes by alias)."""
    return {
        (info.serialization_alias or info.alias or name): name
        for name, info in cls.model_fields.items()
    }


@functools.cache
def _stored_dataclass_fields(cls: type) -> dict[str, str]:
    """A dataclass's fields by the key its JSON form stores each under (a pydantic
    dataclass's alias, or the name)."""
    infos = getattr(cls, "__pydantic_fields__", None) or {}
    stored = {}
    for f in dataclasses.fields(cls):
        info = infos.get(f.name)
        stored[(info.serialization_alias or info.alias or f.name) if info else f.name] = f.name
    return stored
