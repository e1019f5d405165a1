"""The DBOS half of ``benchmarks.dbos_compare``, run only by ``benchmarks/.dbos-venv``'s python.

It imports ``dbos`` and the standard library, never ``flowx``, and nothing in the FlowX
virtualenv imports it. ``benchmarks.dbos_compare`` starts it as a subprocess, one process per
measurement, and reads one JSON line from its stdout:

    python benchmarks/dbos_side.py run --url URL [--schema S] --concurrency 16 --instances 2000
    python benchmarks/dbos_side.py submit --url URL [--schema S] --instances 2000
    python benchmarks/dbos_side.py worker --url URL [--schema S] --ready-file PATH
    python benchmarks/dbos_side.py version

The workflow is the FlowX benchmark's: three steps, each returning its input, in one workflow.
Both are ``async``, run on this process's event loop with ``DBOS.start_workflow_async``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

QUEUE = "bench"
STEPS = 3


def _configure(url: str, schema: str | None, executor: str) -> Any:
    from dbos import DBOS

    config: dict[str, Any] = {
        "name": "dbos-bench",
        "system_database_url": url,
        "log_level": "WARNING",
        # One version for the submitter and every worker, so each dequeues what the other
        # enqueued; the default is a hash of the registered code, the same here anyway.
        "application_version": "bench",
        "executor_id": executor,
    }
    if schema:
        config["dbos_system_schema"] = schema
    DBOS(config=config)  # type: ignore[arg-type]

    @DBOS.step()
    async def noop(n: int) -> int:
        return n

    @DBOS.workflow()
    async def bench_flow(n: int) -> int:
        last = 0
        for _ in range(STEPS):
            last = await noop(n)
        return last

    return bench_flow


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from dbos import DBOS

    flow = _configure(args.url, args.schema, f"run-{os.getpid()}")
    DBOS.launch()
    try:
        gate = asyncio.Semaphore(args.concurrency)
        latencies: list[float] = []

        async def one(n: int) -> None:
            async with gate:
                began = time.perf_counter()
                handle = await DBOS.start_workflow_async(flow, n)
                assert await handle.get_result() == n
                latencies.append(time.perf_counter() - began)

        await one(-1)  # warm-up: schema, pool, first connection
        latencies.clear()
        started = time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(args.instances)))
        elapsed = time.perf_counter() - started
    finally:
        DBOS.destroy()
    return {
        "elapsed_s": elapsed,
        "flows_per_s": args.instances / elapsed,
        "p50_ms": _percentile(latencies, 0.50) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
    }


async def _submit(args: argparse.Namespace) -> dict[str, Any]:
    from dbos import DBOS

    flow = _configure(args.url, args.schema, f"submit-{os.getpid()}")
    DBOS.listen_queues([])  # this process only enqueues; the workers dequeue
    DBOS.launch()
    try:
        queue = await DBOS.register_queue_async(
            QUEUE,
            worker_concurrency=args.worker_concurrency,
            polling_interval_sec=args.poll,
        )
        started = time.perf_counter()
        for first in range(0, args.instances, 64):
            chunk = range(first, min(args.instances, first + 64))
            await asyncio.gather(*(queue.enqueue_async(flow, i) for i in chunk))
        elapsed = time.perf_counter() - started
    finally:
        DBOS.destroy()
    return {"submit_s": elapsed}


def _worker(args: argparse.Namespace) -> None:
    from dbos import DBOS

    _configure(args.url, args.schema, f"worker-{os.getpid()}")
    DBOS.listen_queues([QUEUE])
    DBOS.launch()
    args.ready_file.write_text(str(os.getpid()))
    stop = asyncio.Event()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()

    try:
        asyncio.run(serve())
    finally:
        DBOS.destroy(workflow_completion_timeout_sec=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["run", "submit", "worker", "version"])
    parser.add_argument("--url", default="")
    parser.add_argument("--schema", default=None)
    parser.add_argument("--instances", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--worker-concurrency", type=int, default=None)
    parser.add_argument("--poll", type=float, default=1.0, help="queue polling interval, s")
    parser.add_argument("--ready-file", type=Path, default=None)
    args = parser.parse_args()
    if args.command == "version":
        out: dict[str, Any] = {"dbos": version("dbos"), "python": sys.version.split()[0]}
    elif args.command == "run":
        out = asyncio.run(_run(args))
    elif args.command == "submit":
        out = asyncio.run(_submit(args))
    else:
        _worker(args)
        return
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
