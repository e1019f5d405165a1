"""Bearer tokens with two scopes: ``read`` (list, show, result, outbox, health) and ``admin``
(everything, including start, signal, cancel, terminate, replay and a dead letter's retry).

Tokens come from the host's settings (``api_token``, ``api_read_token``; ``FLOWX_API_TOKEN``
…), compared in constant time. A host with neither token set asks for none: that is for a
developer's loopback, and ``flowx serve`` refuses any other address without a token. The web
UI sends the same token from an HttpOnly cookie it sets at sign-in, so one check serves both.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Annotated, Final, Literal

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from flowx.api.errors import Forbidden, Unauthenticated
from flowx.hosting.settings import HostSettings

Scope = Literal["read", "admin"]

#: The cookie the web UI keeps the token in.
COOKIE: Final = "flowx_token"
BEARER: Final = HTTPBearer(auto_error=False, description="api_token (admin) or api_read_token")


def presented(request: Request) -> str | None:
    """The token a request carries: ``Authorization: Bearer …``, else the UI's cookie."""
    header = request.headers.get("authorization")
    if header is not None:
        kind, _, token = header.partition(" ")
        return token.strip() if kind.lower() == "bearer" else None
    return request.cookies.get(COOKIE)


def _same(given: str, secret: SecretStr | None) -> bool:
    if secret is None:
        return False
    return hmac.compare_digest(given.encode(), secret.get_secret_value().encode())


def scope_of(settings: HostSettings, token: str | None) -> Scope | None:
    """The scope ``token`` grants; ``admin`` to anyone when no token is configured."""
    if settings.api_token is None and settings.api_read_token is None:
        return "admin"
    if not token:
        return None
    if _same(token, settings.api_token):
        return "admin"
    if _same(token, settings.api_read_token):
        return "read"
    return None


def requires(scope: Scope, settings: HostSettings) -> Callable[..., Awaitable[Scope]]:
    """A FastAPI dependency that lets a request through only with ``scope``."""

    async def check(
        request: Request,
        # Declares the scheme in the OpenAPI document; the token is read by ``presented``,
        # which also takes the UI's cookie.
        _: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
    ) -> Scope:
        granted = scope_of(settings, presented(request))
        if granted is None:
            raise Unauthenticated(
                "this API needs a bearer token: send 'Authorization: Bearer <token>' with the "
                "api_token (or api_read_token to read) the server was started with"
            )
        if scope == "admin" and granted != "admin":
            raise Forbidden("this token may only read; this action needs the admin api_token")
        return granted

    return check
