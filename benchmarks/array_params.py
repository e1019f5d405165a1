"""What sending a batch's arrays costs the client: psycopg's text format against binary.

The batched statements (``COMMIT_BATCH``, the batched creates, suspends, signals, releases,
claims) pass one array per column. This measures, on the client alone, psycopg dumping the
parameters ``batch_params`` builds for a batch of ``--batch`` step commits (B7's payloads),
with every placeholder in text format and in binary, interleaved round by round. No statement
is sent: the connection only gives psycopg its type map.

    python -m benchmarks.array_params --store postgresql://postgres@127.0.0.1:5432/test

Writes ``benchmarks/results/array_params.json`` (µs per batch, medians over rounds, and the
text/binary ratio) and prints a table. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import uuid
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import psycopg
from psycopg.adapt import PyFormat, Transformer

from flowx.stores.postgres.commit import batch_params
from flowx.stores.records import InstanceState, Outcome, StepCommit, StepWrite

RESULTS = Path(__file__).parent / "results"


def _batch(size: int) -> list[StepCommit]:
    now = datetime.now(UTC)
    return [
        StepCommit(
            instance_id=str(uuid.uuid4()),
            token=7,
            now=now,
            step=StepWrite(
                scope="",
                step_id=2,
                attempt=1,
                step_name=f"step{n}",
                outcome=Outcome.SUCCESS,
                result=str(n),
                capability_id="bench.noop",
                capability_version="1.0.0",
                nondeterministic=None,
                duration_ms=0,
            ),
            state_bag=json.dumps({"last": n}),
            state=InstanceState.COMPLETED if n % 3 == 0 else None,
        )
        for n in range(size)
    ]


def _per_batch_us(tx: Transformer, values: list[object], fmt: PyFormat, reps: int) -> float:
    formats = [fmt] * len(values)
    started = time.perf_counter()
    for _ in range(reps):
        tx.dump_sequence(values, formats)
    return (time.perf_counter() - started) / reps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--batch", type=int, default=28, help="commits per batch")
    ap.add_argument("--reps", type=int, default=2000, help="batches dumped per round and arm")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS / "array_params.json")
    args = ap.parse_args()

    values = list(batch_params(_batch(args.batch)).values())
    arms = {"text": PyFormat.TEXT, "binary": PyFormat.BINARY}
    runs: dict[str, list[float]] = {name: [] for name in arms}
    with psycopg.connect(args.store) as conn:
        for r in range(args.rounds):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            for name in order:
                runs[name].append(_per_batch_us(Transformer(conn), values, arms[name], args.reps))
    median = {name: statistics.median(v) for name, v in runs.items()}
    ratios = [t / b for t, b in zip(runs["text"], runs["binary"], strict=True)]
    report = {
        "benchmark": "client cost of a batch's array parameters, text against binary",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "psycopg": metadata.version("psycopg")},
        "commits_per_batch": args.batch,
        "columns": len(values),
        "rounds": args.rounds,
        "us_per_batch": {name: round(v, 1) for name, v in median.items()},
        "text_over_binary": round(statistics.median(ratios), 2),
        "runs_us": {name: [round(x, 1) for x in v] for name, v in runs.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{args.batch} commits a batch, {len(values)} array columns, {args.rounds} rounds")
    for name, v in median.items():
        print(f"  {name:>6}  {v:8.1f} µs a batch  {v / args.batch:6.1f} µs a commit")
    print(f"  text/binary {report['text_over_binary']}x; written to {args.out}")


if __name__ == "__main__":
    main()
