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

import base64
import binascii
import functools
import os
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, TypeVar

from pydantic import BaseModel, SecretBytes, SecretStr

from flowx.errors import FlowXError

T = TypeVar("T")

#: The key an envelope is recognised by (it sorts first in canonical JSON).
MARK: Final = "$flowx.sealed"
#: What every display shows in place of a sensitive member.
MASK: Final = "**********"
#: The envelope's format version.
_V1: Final = "v1"
_NONCE: Final = 12


class SensitiveMark:
    """The ``Annotated`` marker behind ``flowx.Sensitive[T]``."""

    def __repr__(self) -> str:
        return "flowx.Sensitive"


SENSITIVE: Final = SensitiveMark()

#: ``flowx.Sensitive[str]``: a member stored sealed and shown masked, of any JSON type.
Sensitive = Annotated[T, SENSITIVE]


class KeysError(FlowXError):
    """A key that is missing, malformed, or unknown to an envelope."""


@dataclass(frozen=True)
class Keyring:
    """AES-256-GCM keys by id; ``current`` seals, every key opens."""

    keys: Mapping[str, bytes]
    current: str

    @classmethod
    def parse(cls, text: str) -> Keyring:
        """``"k2:<base64 32 bytes>,k1:<...>"``: the first key is the one new writes use."""
        keys: dict[str, bytes] = {}
        order: list[str] = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            key_id, sep, encoded = part.partition(":")
            key_id = key_id.strip()
            if not sep or not key_id or not key_id.isascii() or not key_id.isprintable():
                raise KeysError(
                    "encryption keys must be 'id:base64key' pairs separated by commas; "
                    "make one with `flowx keys generate`",
                    code="keys.malformed",
                )
            try:
                raw = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                raw = b""
            if len(raw) != 32:
                raise KeysError(
                    f"encryption key {key_id!r} is not 32 bytes of base64 (AES-256); "
                    "make one with `flowx keys generate`",
                    code="keys.malformed",
                )
            if key_id in keys:
                raise KeysError(f"encryption key {key_id!r} is given twice", code="keys.malformed")
            keys[key_id] = raw
            order.append(key_id)
        if not order:
            raise KeysError("no encryption key given", code="keys.malformed")
        try:
            import cryptography  # noqa: F401
        except ImportError:
            raise KeysError(
                "encryption keys need the cryptography package: pip install 'flowx[crypto]'",
                code="keys.no_crypto",
            ) from None
        return cls(keys=keys, current=order[0])

    def seal(self, plaintext: bytes, kind: str, aad: str) -> dict[str, str]:
        """An envelope of ``plaintext`` under the current key, bound to ``aad`` (a fresh
        nonce each time: the same value sealed twice gives two texts)."""
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = os.urandom(_NONCE)
        data = AESGCM(self.keys[self.current]).encrypt(nonce, plaintext, aad.encode())
        return {
            MARK: _V1,
            "k": self.current,
            "t": kind,
            "n": base64.b64encode(nonce).decode(),
            "c": base64.b64encode(data).decode(),
        }

    def open(self, envelope: Mapping[str, Any], aad: str) -> bytes:
        """The plaintext of ``envelope``, under whichever configured key sealed it;
        ``KeysError`` if that key is gone or the envelope was altered or moved."""
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        key_id = str(envelope.get("k"))
        key = self.keys.get(key_id)
        if key is None:
            raise KeysError(
                f"a sealed value was written under key {key_id!r}, which is not configured; "
                "add it back to encryption_keys (after the current key) to read it",
                code="keys.unknown",
            )
        try:
            nonce = base64.b64decode(str(envelope["n"]))
            data = base64.b64decode(str(envelope["c"]))
            return AESGCM(key).decrypt(nonce, data, aad.encode())
        except (InvalidTag, KeyError, binascii.Error, ValueError) as exc:
            shown = aad.replace("\x1f", " / ")
            raise KeysError(
                f"a sealed value under key {key_id!r} does not open at {shown}: it was "
                "altered, or moved from another instance or field",
                code="keys.tampered",
            ) from exc


def generate_key() -> str:
    """A fresh AES-256 key, base64."""
    return base64.b64encode(os.urandom(32)).decode()


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
    if any(isinstance(m, SensitiveMark) for m in metadata):
        return SEAL_JSON
    for arg in _flatten(annotation):
        if arg is SecretStr:
            return SEAL_STR
        if arg is SecretBytes:
            return SEAL_BYTES
    return None


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


def declares_sensitive(tp: Any, _seen: set[Any] | None = None) -> bool:
    """Whether values of type ``tp`` can hold a sensitive member at any depth."""
    seen = _seen if _seen is not None else set()
    if tp in seen:
        return False
    try:
        seen.add(tp)
    except TypeError:
        return False
    if tp is SecretStr or tp is SecretBytes:
        return True
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *meta = typing.get_args(tp)
        return any(isinstance(m, SensitiveMark) for m in meta) or declares_sensitive(base, seen)
    if origin is not None:
        return any(declares_sensitive(arg, seen) for arg in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        for info in tp.model_fields.values():
            if any(isinstance(m, SensitiveMark) for m in info.metadata):
                return True
            if declares_sensitive(info.annotation, seen):
                return True
    return False
