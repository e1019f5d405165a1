"""One wording for a pydantic ``ValidationError``, for every message that reports one.

An input, a signal payload and the host settings are all checked by pydantic; a user reading
any of those errors sees each problem as ``<where>: <what>``, joined by ``; ``, so one
parser (a log search, a test) reads them all.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


def problems(exc: ValidationError, *, root: str = "(root)", field_label: bool = True) -> str:
    """Each error of ``exc`` as ``field 'a.b': msg`` (or ``a.b: msg`` without ``field_label``),
    joined by ``; ``. A problem with the whole value, not one field, is located at ``root``."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or root
        parts.append(
            f"field '{where}': {error['msg']}" if field_label else f"{where}: {error['msg']}"
        )
    return "; ".join(parts)


def field_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Each error of ``exc`` as ``{"loc": [...], "msg": ..., "type": ...}``: what an HTTP 422
    lists. The offending value is left out: it may be a secret, and the caller sent it."""
    return [
        {"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_input=False, include_context=False)
    ]
