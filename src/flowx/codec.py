"""The one canonical JSON encoding every stored payload uses.

Sorted keys, compact separators, NaN and Infinity refused at encode time, integers of any size
kept, floats as Python's shortest round-trip ``repr``. One encoder, never mixed with another
library's float printing (``1e-07`` vs ``1e-7``), so bytes written today compare equal to bytes
written by a later release. Rows carry ``CODEC_VERSION`` so the encoding can change without
rewriting history. Never pickle.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import PydanticSerializationError, to_jsonable_python

from flowx.errors import SerialisationError

CODEC_VERSION = 1

_encoder = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False
)


def to_json_value(value: Any) -> Any:
    """Turn a pydantic model, dataclass, datetime, UUID, ... into plain JSON values."""
    try:
        return to_jsonable_python(value)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise SerialisationError(
            f"{type(value).__name__} has no JSON form ({exc}); return a pydantic model, "
            "a dataclass or plain JSON values (str, int, float, bool, None, list, dict)"
        ) from exc


def dumps(value: Any) -> str:
    """Encode ``value`` canonically; raise ``SerialisationError`` naming what was wrong."""
    plain = to_json_value(value)
    try:
        return _encoder.encode(plain)
    except ValueError as exc:  # NaN / Infinity
        raise SerialisationError(
            f"value cannot be stored as JSON: {exc}; NaN and Infinity have no JSON form, "
            "store them as null or a string"
        ) from exc
    except TypeError as exc:
        raise SerialisationError(f"value cannot be stored as JSON: {exc}") from exc


def loads(text: str) -> Any:
    """Decode a stored payload. Stored payloads are trusted: they were written by ``dumps``."""
    return json.loads(text)
