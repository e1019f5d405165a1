"""OpenTelemetry spans for what FlowX does (R9.6), through ``opentelemetry-api`` only.

``flowx-runtime[otel]`` brings the API; the application installs an SDK and an exporter, as with any
instrumented library. Without the API nothing here does anything; with it and no SDK the
spans are the API's no-op ones.

An instance is one trace, whichever nodes run it: ``host.start`` opens ``flowx.start`` and
the instance row keeps its W3C ``traceparent`` (``trace_context``); every run of it — on the
node that started it, on another after a crash, woken by a timer or a signal — opens
``flowx.run`` as a child of that context, and a sub-flow child is started with the context of
its parent's run. Step attempts and compensations are children of the run
(``flowx.step``, ``flowx.compensate``); a delivered signal is ``flowx.signal``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

_trace: Any
_context: Any
_propagator: Any
_tracer: Any
try:  # optional: flowx-runtime[otel]
    from opentelemetry import context as _context
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _propagator = TraceContextTextMapPropagator()
    #: A proxy: it picks up whatever tracer provider the application installs, even later.
    _tracer = _trace.get_tracer("flowx")
    _NO_SDK: tuple[type, ...] = (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)
except ImportError:  # pragma: no cover - exercised only without the extra
    _trace = None
    _context = None
    _propagator = None
    _tracer = None
    _NO_SDK = ()

#: Set once a real provider is seen (globally, or given to ``use``): the global one cannot be
#: unset, so from then on every span is made.
_recording = False
#: Shared: a ``nullcontext`` holds no state and can be entered any number of times at once.
_NOTHING: AbstractContextManager[None] = contextlib.nullcontext()

_DEFAULT_TRACER = _tracer

Attributes = Mapping[str, str | int | bool | None]


def current_context() -> str | None:
    """The ``traceparent`` of the span current here, to keep with what it starts (an
    instance row); ``None`` without the API or outside any span."""
    if _propagator is None:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


#: Whether the environment names a provider for the API to load (read once: the API's own
#: lookup reads ``os.environ`` on every call, and this runs for every step attempt).
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def quiet() -> bool:
    """No span would be recorded here (no SDK is installed): a hot caller then skips
    building a span's attributes at all (``span`` would return a shared no-op).

    One function, asked on every step attempt: while nothing was set, the provider is read
    from where the API keeps the one an application sets (``_TRACER_PROVIDER``, read
    defensively, falling back to the public ``get_tracer_provider()`` should a release of
    the API not have it), without the API's environment lookup."""
    global _recording
    if _recording or _trace is None:
        return _trace is None
    if _tracer is _DEFAULT_TRACER:
        if not _PROVIDER_FROM_ENV and getattr(_trace, "_TRACER_PROVIDER", False) is None:
            return True
        if isinstance(_trace.get_tracer_provider(), _NO_SDK):
            return True
    _recording = True
    return False


def span(
    name: str, attributes: Attributes, *, parent: str | None = None, root: bool = False
) -> AbstractContextManager[Any]:
    """A span named ``name``, current for the block: a child of ``parent`` (a kept
    ``traceparent``) when given; else, with ``root``, the start of a trace of its own; else
    a child of whatever span is current. An exception leaving the block is recorded on it,
    and the span marked as an error; ``None`` attributes are left out.

    Without an SDK, a child of the current span is that span itself (the API's no-op tracer
    returns it), so it is not made at all: in a cProfile of B7 at 64 in flight these no-op
    spans were about 14 % of the profiled time; end to end B7 gained 1.00–1.03x (issue 14).
    A span with a ``parent`` is still made: it carries the kept trace context to what the
    block starts (a sub-flow child keeps its parent's trace even on a node without an SDK).
    A ``root`` with no parent only takes the inherited span away from the block (baggage and
    other context entries stay): the no-op span it would make carries nothing."""
    if parent is None and quiet():
        return _Untraced() if root and _context is not None else _NOTHING
    return _span(name, attributes, parent=parent, root=root)


class _Untraced:
    """A root span where none would be recorded: the block inherits no span (as under a
    root span, a sub-flow it starts keeps no trace context) and keeps every other context
    entry (baggage ...), as the API's no-op root span did; no span is made."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _context.attach(_trace.set_span_in_context(_trace.INVALID_SPAN))

    def __exit__(self, *exc: object) -> None:
        _context.detach(self._token)


@contextlib.contextmanager
def _span(name: str, attributes: Attributes, *, parent: str | None, root: bool) -> Iterator[Any]:
    if _trace is None:
        yield None
        return
    if parent:
        context = _propagator.extract({"traceparent": parent})
    else:
        context = _context.Context() if root else None
    attrs = {f"flowx.{k}": v for k, v in attributes.items() if v is not None}
    with _tracer.start_as_current_span(name, context=context, attributes=attrs) as current:
        yield current


def annotate(current: Any, **attributes: str | int | bool | None) -> None:
    """Set attributes learnt during the span (its outcome, an error code)."""
    if current is None or not current.is_recording():
        return
    for key, value in attributes.items():
        if value is not None:
            current.set_attribute(f"flowx.{key}", value)


def use(provider: Any) -> None:
    """Trace through ``provider`` (an SDK ``TracerProvider``) rather than the global one;
    ``None`` goes back to the global. For a test, or an application that keeps FlowX's spans
    apart; others install their provider globally and need not call this."""
    global _tracer, _recording
    if _trace is None:
        raise RuntimeError("opentelemetry-api is not installed: pip install 'flowx-runtime[otel]'")
    _tracer = provider.get_tracer("flowx") if provider is not None else _DEFAULT_TRACER
    _recording = provider is not None
