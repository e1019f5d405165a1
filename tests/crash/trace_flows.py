"""The crash flows, in a worker that traces: importing this module (``--flows``) installs an
OpenTelemetry SDK provider that writes every finished span, as one JSON line, to the file
``$CRASH_TRACE_FILE`` — synchronously, so a span is on disk before a SIGKILL can lose it."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from flowx import tracing
from tests.crash.crash_flows import FLOWS as FLOWS


class JsonLines(SpanExporter):
    """Appends ``{name, trace_id, span_id, parent_id, attributes}`` per span."""

    def __init__(self, path: str) -> None:
        self._path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self._path, "a", encoding="utf-8") as out:
            for s in spans:
                assert s.context is not None
                line: dict[str, Any] = {
                    "name": s.name,
                    "trace_id": f"{s.context.trace_id:032x}",
                    "span_id": f"{s.context.span_id:016x}",
                    "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
                    "attributes": dict(s.attributes or {}),
                    "pid": os.getpid(),
                }
                out.write(json.dumps(line) + "\n")
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(JsonLines(os.environ["CRASH_TRACE_FILE"])))
tracing.use(_provider)
