"""The keys that seal sensitive members (R9.8): AES-256-GCM, by key id, rotatable.

An envelope names the key that sealed it (``k``), so keys rotate: new writes use the current
key (the first configured), and every configured key still opens what it sealed. Kept apart
from ``flowx.sealing``, which decides *what* is sealed, so the cryptography stays in one
small place (and is imported only when keys are used).
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from flowx.errors import FlowXError

#: The key an envelope is recognised by (it sorts first in canonical JSON).
MARK: Final = "$flowx.sealed"
#: The envelope's format version.
_V1: Final = "v1"
_NONCE: Final = 12


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
