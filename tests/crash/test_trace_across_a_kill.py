"""A trace survives a SIGKILL (R9.6): an instance started in one process, run by a worker
that is killed mid-step, and finished by another worker process is one trace — the start,
both runs and every attempt, on three processes."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import flowx
from flowx import tracing
from tests.crash.crash_flows import Job, job
from tests.crash.test_kill_a_worker import _final, _wait_for
from tests.crash.workers import start_worker

pytestmark = pytest.mark.crash


async def _start_traced(db: str, exporter: InMemorySpanExporter) -> tuple[str, Any]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    try:
        async with flowx.FlowHost(
            store=flowx.from_url(db),
            flows=[job],
            settings=flowx.HostSettings.load(recovery=False),
        ) as host:
            handle = await host.start(job, Job(name="traced"), run_here=False)
    finally:
        tracing.use(None)
    [start] = exporter.get_finished_spans()
    return handle.instance_id, start


def _spans(path: Path, instance_id: str) -> list[dict[str, Any]]:
    """The spans a worker wrote of ``instance_id``."""
    lines = path.read_text().splitlines() if path.exists() else []
    spans = [json.loads(line) for line in lines]
    return [s for s in spans if s["attributes"].get("flowx.instance") == instance_id]


def test_an_instance_is_one_trace_across_a_sigkill_and_another_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'flowx.db'}"
    exporter = InMemorySpanExporter()
    iid, start = asyncio.run(_start_traced(db, exporter))
    assert start.name == "flowx.start" and start.context is not None
    trace_id, start_id = f"{start.context.trace_id:032x}", f"{start.context.span_id:016x}"

    (tmp_path / "park-before-effect-b").write_text("")
    monkeypatch.setenv("CRASH_TRACE_FILE", str(tmp_path / "first.jsonl"))
    first = start_worker(db, tmp_path, "tests.crash.trace_flows:FLOWS")
    second: subprocess.Popen[bytes] | None = None
    try:
        _wait_for(tmp_path / "parked-b", first)
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL
        monkeypatch.setenv("CRASH_TRACE_FILE", str(tmp_path / "second.jsonl"))
        second = start_worker(db, tmp_path, "tests.crash.trace_flows:FLOWS")
        assert asyncio.run(_final(db, iid)) is flowx.InstanceState.COMPLETED
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()

    before, after = _spans(tmp_path / "first.jsonl", iid), _spans(tmp_path / "second.jsonl", iid)
    # The killed worker's run never ended, so never exported; its finished attempt did.
    assert [s["attributes"]["flowx.step"] for s in before if s["name"] == "flowx.step"] == [
        "crash.a"
    ]
    [resumed] = [s for s in after if s["name"] == "flowx.run"]
    assert resumed["attributes"]["flowx.outcome"] == "completed"
    assert {s["trace_id"] for s in before + after} == {trace_id}
    assert resumed["parent_id"] == start_id  # a child of the start, not of the dead run
    steps = [s["attributes"]["flowx.step"] for s in after if s["name"] == "flowx.step"]
    assert steps == ["crash.b", "crash.c"]
