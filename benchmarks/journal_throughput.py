"""B7: step-commits per second through the real engine, at concurrency 1, 16 and 64.

N instances of an M-step flow run through ``FlowHost`` on a real store; each step's
capability does nothing, so what is measured is the runtime's own cost per step boundary: the
engine, the lease, and the journal commit. Every commit's latency is taken at the journal seam.

    python -m benchmarks.journal_throughput --store sqlite:///bench.db

Writes ``benchmarks/results/journal_throughput-<backend>.json`` and prints a table. A benchmark,
not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import flowx
from flowx.stores.records import StepCommit

RESULTS = Path(__file__).resolve().parent / "results"


class Job(BaseModel):
    n: int


class JobState(BaseModel):
    last: int | None = None


@flowx.capability("bench.noop", version="1.0.0")
async def noop(ctx: flowx.StepContext, job: Job) -> int:
    return job.n


def make_plan(steps: int) -> flowx.Plan:
    builder = flowx.flow("bench.flow", version="1.0.0", input=Job, state=JobState)
    for i in range(steps):
        builder.step(noop, name=f"s{i}", into="last")
    return builder.build()


class TimedJournal:
    """Delegates to a journal, timing each commit (the hot path under measurement)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.latencies: list[float] = []

    def commit(self, commit: StepCommit) -> Awaitable[int | None]:
        """The inner commit, timed from the moment it is asked for until it is answered. A
        store that answers with a future (PostgreSQL's group committer) is timed by a
        callback on it: a coroutine around it would add a frame to every step's suspension
        and resumption that the engine itself does not have (the raw arms time their
        commits inline, in their own frame)."""
        started = time.perf_counter()
        made = self._inner.commit(commit)
        if isinstance(made, asyncio.Future):
            latencies = self.latencies
            made.add_done_callback(lambda _: latencies.append(time.perf_counter() - started))
            return made
        return self._timed(made, started)

    async def _timed(self, made: Awaitable[int | None], started: float) -> int | None:
        try:
            return await made
        finally:
            self.latencies.append(time.perf_counter() - started)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TimedStores:
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.journal = TimedJournal(inner.journal)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_level(
    url: str,
    plan: flowx.Plan,
    instances: int,
    concurrency: int,
    *,
    make_store: Callable[[str], Any] = flowx.from_url,
    warm_together: bool = False,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One level of B7 on the store ``make_store`` builds from ``url`` (FlowX's own by
    default; ``benchmarks.ceiling``'s engine-asyncpg arm gives its own).

    Before the clock starts, one flow runs alone; with ``warm_together`` (the ceiling, whose
    raw arms warm up so), ``concurrency`` more then run at once, so every batch lane's
    connection has its batched statements prepared before the timed flows need them.
    ``settings``: host settings of the run's own (``benchmarks.gc_threshold``)."""
    stores = TimedStores(make_store(url))
    base = flowx.HostSettings(max_concurrent_flows=concurrency)
    async with flowx.FlowHost(
        store=stores,
        flows=[plan],
        settings=base.replace(recovery=False, **(settings or {})),  # type: ignore[arg-type]
    ) as host:
        gate = asyncio.Semaphore(concurrency)

        async def one(n: int) -> None:
            async with gate:
                handle = await host.start(plan, Job(n=n))
                await handle.result(poll=0.001)

        await one(-1)  # warm-up: schema, statement cache, first connection
        if warm_together and concurrency > 1:
            await asyncio.gather(*(one(-2 - n) for n in range(concurrency)))
        stores.journal.latencies.clear()
        started = time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(instances)))
        elapsed = time.perf_counter() - started
    lat = stores.journal.latencies
    step_commits = instances * len(plan.body)
    return {
        "concurrency": concurrency,
        "instances": instances,
        "steps_per_instance": len(plan.body),
        "elapsed_s": round(elapsed, 3),
        "step_commits": step_commits,
        "all_commits": len(lat),
        "step_commits_per_s": round(step_commits / elapsed, 1),
        "flows_per_s": round(instances / elapsed, 1),
        "commit_p50_ms": round(percentile(lat, 0.50) * 1000, 3),
        "commit_p99_ms": round(percentile(lat, 0.99) * 1000, 3),
        "commit_mean_ms": round(statistics.fmean(lat) * 1000, 3) if lat else 0.0,
    }


class _Counted:
    """A span exporter that counts what it is given and keeps nothing."""

    def __init__(self) -> None:
        self.count = 0

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.count += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def _traced(ratio: float) -> _Counted:
    """Switch FlowX's tracing on, exported in batches (``--trace``): every trace sampled, or
    the share ``ratio`` of them (``--trace-ratio``, a head sampler as production uses)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from flowx import tracing

    exporter = _Counted()
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(exporter))  # type: ignore[arg-type]
    tracing.use(provider)
    return exporter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=None, help="store URL (default: a fresh SQLite file)")
    parser.add_argument("--instances", type=int, default=500)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    parser.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="the event loop (uvloop: measured only, `pip install uvloop`)",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="trace every span (the OpenTelemetry SDK, always sampled, batched to an exporter "
        "that counts and drops them): the cost of tracing switched on",
    )
    parser.add_argument(
        "--trace-ratio",
        type=float,
        default=1.0,
        help="with --trace: the share of traces sampled (default 1: every one)",
    )
    args = parser.parse_args()
    plan = make_plan(args.steps)
    exported = _traced(args.trace_ratio) if args.trace else None
    if args.loop == "uvloop":
        import uvloop  # a measured-only dependency: benchmarks/event_loops.py

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for level in (int(c) for c in args.concurrency.split(",")):
            url = args.store or f"sqlite:///{Path(tmp) / f'bench-{level}.db'}"
            results.append(asyncio.run(run_level(url, plan, args.instances, level)))
    backend = (args.store or "sqlite://").split(":", 1)[0]
    record = {
        "benchmark": "B7 journal throughput",
        "store": backend,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "note": "each level commits `steps` step rows plus one final transition per instance",
        "loop": args.loop,
        "tracing": args.trace,
        "trace_ratio": args.trace_ratio if args.trace else None,
        "spans_exported": exported.count if exported is not None else None,
        "results": results,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = args.out or RESULTS / f"journal_throughput-{backend}-{args.steps}steps.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    cols = [
        "concurrency",
        "step_commits_per_s",
        "flows_per_s",
        "commit_p50_ms",
        "commit_p99_ms",
        "elapsed_s",
    ]
    print(f"B7 journal throughput on {backend}: {args.instances} instances x {args.steps} steps")
    print("  ".join(f"{c:>18}" for c in cols))
    for r in results:
        print("  ".join(f"{r[c]:>18}" for c in cols))
    if backend.startswith("postgres"):
        # The ceiling measured on this machine with pgbench for the same commit pattern,
        # one commit per transaction (see the issue that introduced B7).
        best = max(r["step_commits_per_s"] for r in results)
        print(
            f"best: {best:.0f} step-commits/s = {best / 5300:.0%} of the ~5,300/s "
            "one-per-transaction pgbench ceiling"
        )
    print(f"written to {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out}")


if __name__ == "__main__":
    main()
