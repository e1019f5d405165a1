"""The ASGI application: FastAPI, chosen for the OpenAPI document it derives from the same
pydantic models that validate each request (``docs/openapi.json`` is that document, checked
in and tested to be current), on Starlette, which it is built on; served by uvicorn.

``create_app(host)`` wraps a host someone else opens (a worker serving the API beside its
work, a test); ``flowx serve`` builds one that opens and drains its own host.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

from fastapi import FastAPI, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse
from starlette.exceptions import HTTPException

from flowx import __version__
from flowx.api import errors, models, routes, ui
from flowx.errors import FlowXError
from flowx.hosting.host import FlowHost

#: How long readiness waits for the journal to answer before it says it is down.
PROBE_TIMEOUT: Final = 2.0
#: An id no instance has: readiness reads it to see that the journal answers.
PROBE_ID: Final = "00000000-0000-0000-0000-000000000000"

#: Every error an operation may answer, in the body every error has.
ERROR_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    status: {"model": models.ErrorBody, "description": what}
    for status, what in (
        (400, "Refused for another reason the message names"),
        (401, "No token, or not the API's"),
        (403, "A read-only token asked for an admin action"),
        (404, "No such instance, flow or dead letter"),
        (409, "The instance is in the wrong state for this"),
        (422, "The request (or the flow's input) is invalid: each field is listed"),
        (503, "The journal is out of reach or the node is draining: retry after Retry-After"),
    )
}


def create_app(host: FlowHost, *, run_here: bool = False, owns_host: bool = False) -> FastAPI:
    """The HTTP API over ``host``. ``run_here``: starts and signals run instances in this
    process (a worker); otherwise they are left ``Pending`` for the workers. ``owns_host``:
    the app opens the host at start-up and drains it at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not owns_host:
            yield
            return
        await host.open()
        try:
            yield
        finally:
            await host.drain()

    app = FastAPI(
        title="FlowX",
        version=__version__,
        summary="Start, signal, inspect, stop and replay durable flow instances.",
        lifespan=lifespan,
        docs_url=None,  # its page loads scripts from a CDN; /openapi.json is the reference
        redoc_url=None,
        responses=ERROR_RESPONSES,
    )
    app.add_exception_handler(FlowXError, errors.on_flowx_error)
    app.add_exception_handler(RequestValidationError, errors.on_invalid_request)
    app.add_exception_handler(HTTPException, errors.on_http_error)
    app.add_exception_handler(Exception, errors.on_bug)
    app.include_router(routes.build(host, run_here=run_here))
    app.include_router(ui.build(host, run_here=run_here))

    @app.get("/", include_in_schema=False)
    async def home() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=303)

    @app.get("/healthz", response_model=models.Health, tags=["health"])
    async def health() -> dict[str, Any]:
        """Liveness: the process answers. Never asks for a token."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        response_model=models.Readiness,
        tags=["health"],
        responses={503: {"model": models.Readiness, "description": "Not ready"}},
    )
    async def ready(response: Response) -> dict[str, Any]:
        """Readiness (R7.1): open, not draining, and the journal answering now. 503 with
        Retry-After otherwise. Never asks for a token."""
        journal = "none"
        if host.store is not None:
            journal = "up"
            try:
                await asyncio.wait_for(host.store.journal.get(PROBE_ID), PROBE_TIMEOUT)
            except (FlowXError, TimeoutError, OSError):
                journal = "down"
        draining = host.draining
        ready = host.ready and journal != "down"
        if not ready:
            response.status_code = 503
            response.headers["Retry-After"] = str(errors.RETRY_AFTER)
        return {"ready": ready, "journal": journal, "draining": draining}

    return app


def openapi_document() -> dict[str, Any]:
    """The API's OpenAPI document, the same whatever flows a server carries (a flow's input
    schema is answered by ``GET /v1/flows``): what ``docs/openapi.json`` holds."""
    return create_app(FlowHost(flows=[])).openapi()
