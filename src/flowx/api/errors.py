"""FlowX errors as HTTP answers: one table from an error's class to its status, and one body
shape, ``{"error": {"code", "message", "fields"}}``, for every error the API gives.

The statuses follow the CLI's exit codes (``flowx.cli.exits``): not found is 404 where the CLI
exits 3, a wrong state is 409 where it exits 4, a malformed request is 422 where it exits 2.
A retryable error — the journal or the lease store out of reach, a draining node — is 503 with
``Retry-After`` (SPEC §8): the same request may succeed later with no change on the caller's
side. Anything that is not a FlowX error is a bug: 500, logged with its traceback, and the
body says only that (a traceback can carry what a caller must not see).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from flowx import codec
from flowx.errors import (
    DeadLetterNotFound,
    DurabilityNotConfigured,
    FlowNotFound,
    FlowXError,
    IdempotencyConflict,
    IllegalState,
    InputInvalid,
    InstanceNotFound,
    JournalNotFound,
    RequestInvalid,
    SerialisationError,
)
from flowx.stores.errors import InstanceFinished, UnknownInstance

log = logging.getLogger("flowx.api")

#: Seconds a client should wait before retrying a 503.
RETRY_AFTER: Final = 2


class Unauthenticated(FlowXError):
    """No token, or one that is not the API's (HTTP 401)."""

    code = "api.unauthenticated"


class Forbidden(FlowXError):
    """A read-only token asked for an admin action (HTTP 403)."""

    code = "api.forbidden"


#: An error's class (or the nearest base class listed) → its status; any other FlowX error
#: is 400, any retryable one 503.
STATUS: Final[Mapping[type[FlowXError], int]] = {
    Unauthenticated: 401,
    Forbidden: 403,
    InstanceNotFound: 404,
    UnknownInstance: 404,
    FlowNotFound: 404,
    DeadLetterNotFound: 404,
    JournalNotFound: 404,
    IllegalState: 409,
    InstanceFinished: 409,
    IdempotencyConflict: 409,
    DurabilityNotConfigured: 409,
    InputInvalid: 422,
    RequestInvalid: 422,
    SerialisationError: 422,
}

#: Codes of errors that are a node's passing state rather than the request's fault.
UNAVAILABLE_CODES: Final = frozenset({"host.draining", "host.not_open", "host.not_ready"})


def status_of(exc: FlowXError) -> int:
    if exc.retryable or exc.code in UNAVAILABLE_CODES:
        return 503
    for cls in type(exc).__mro__:
        status = STATUS.get(cls)
        if status is not None:
            return status
    return 400


def body(code: str, message: str, fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "fields": fields or []}}


def answer(exc: FlowXError) -> JSONResponse:
    """The response for a FlowX error."""
    status = status_of(exc)
    fields = exc.fields if isinstance(exc, InputInvalid) else None
    # A message may quote what was sent, lone surrogates included: escape them, or the
    # JSON encoder would refuse the error itself.
    doc = body(exc.code, codec.printable(exc.message), fields)
    headers = None
    if status == 503:
        headers = {"Retry-After": str(RETRY_AFTER)}
    elif status == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="flowx"'}
    return JSONResponse(doc, status_code=status, headers=headers)


async def on_flowx_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FlowXError)  # nosec B101  # invariant: registered for FlowXError only
    return answer(exc)


async def on_invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """A request the models refuse (a missing field, a wrong type, a bad query value): 422
    with each field, in the same body as every other error."""
    assert isinstance(exc, RequestValidationError)  # nosec B101  # invariant: registered for it
    fields = [
        {
            "loc": [str(p) for p in e.get("loc", ())],
            "msg": codec.printable(str(e.get("msg", ""))),
            "type": str(e.get("type", "")),
        }
        for e in exc.errors()
    ]
    where = "; ".join(f"{'.'.join(f['loc'])}: {f['msg']}" for f in fields)
    return JSONResponse(
        body("request.invalid", f"the request is invalid: {where}", fields), status_code=422
    )


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own refusals, in the API's body: a body that is not JSON at all (400 from
    FastAPI, a 422 here as every other unreadable request is), an unknown path (404), a method
    the path does not take (405)."""
    assert isinstance(exc, HTTPException)  # nosec B101  # invariant: registered for this type only
    if exc.status_code == 400:
        return JSONResponse(
            body("request.invalid", f"the request is invalid: {exc.detail}"), status_code=422
        )
    code = {404: "http.not_found", 405: "http.method_not_allowed"}.get(
        exc.status_code, "http.error"
    )
    return JSONResponse(
        body(code, str(exc.detail)), status_code=exc.status_code, headers=exc.headers
    )


async def on_bug(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        body("flowx.internal", "the server failed on this request; its log has the cause"),
        status_code=500,
    )
