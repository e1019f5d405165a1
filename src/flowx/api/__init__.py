"""The HTTP API (R9.7): ``create_app(host)`` is an ASGI application over a ``FlowHost``;
``flowx serve`` runs one. Needs the ``flowx-runtime[api]`` extra (FastAPI and uvicorn)."""

from flowx.api.app import create_app

__all__ = ["create_app"]
