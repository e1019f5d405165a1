"""Resumes cut short by a later fault: how many chance would give, against how many happened.

A resume is *interrupted* when the node that took an instance over is itself hit by a later
fault before its first commit on it. If faults fell independently of takeovers, that needs a
fault aimed at the takeover node (one of ``workers``) inside the short window between taking
the lease and the first commit, so the expected count is

    resumes × mean window / mean gap between faults / workers            (model A)

An aimed kill lands on the next step its worker runs after being armed. Were that step a
uniformly random one of the run, it would be the first step of a takeover with probability
resumes / steps run, so

    faults × resumes / steps run                                         (model B)

faults would land on a takeover. Both are computed from a run's fault log
(``benchmarks/results/chaos-trace/*.json``, written by ``python -m benchmarks.chaos``)::

    python -m benchmarks.rig.interrupts benchmarks/results/chaos-trace/kill_after_effect-ttl30.json
"""

from __future__ import annotations

import gzip
import itertools
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def interruption_model(trace: dict[str, Any], steps_run: int) -> dict[str, Any]:
    """The measures above for one arm; ``steps_run`` is how many step executions (effects)
    the run made. Empty when the arm resumed nothing."""
    faults, resumes = trace["faults"], trace["resumes"]
    if len(faults) < 2 or not resumes:
        return {}
    config = trace["config"]
    work = sum(config["work_ms"]) / 2 / 1000
    effects: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for iid, _step, at, pid in trace["effects"]:
        effects[iid].append((at, pid))
    commits: dict[tuple[str, int], list[float]] = defaultdict(list)
    for iid, _step, t, pid in trace["commits"]:
        commits[(iid, pid)].append(t)
    gap = statistics.mean(b["at"] - a["at"] for a, b in itertools.pairwise(faults))
    windows: list[float] = []
    for fi, iid, _t, later in resumes:
        f = faults[fi]
        mine = [(at, pid) for at, pid in effects[iid] if pid != f["pid"] and at > f["at"]]
        if later is not None or not mine:
            continue  # cut short: its window has no end to measure
        at, owner = min(mine)
        done = [t for t in commits[(iid, owner)] if t > f["at"]]
        if done:
            # The lease was taken about one step's work before that step's effect.
            windows.append(min(done) - (at - work))
    interrupted = [r for r in resumes if r[3] is not None]
    hitting = {r[3] for r in interrupted}
    # Faults whose aimed step was the first step of an instance they interrupted.
    on_takeover = len({
        r[3] for r in interrupted
        if faults[r[3]]["parked"] and faults[r[3]]["parked"]["instance_id"] == r[1]
    })  # fmt: skip
    window = statistics.mean(windows) if windows else 0.0
    waits = [
        f["parked"]["at"] - f["parked"]["armed_at"]
        for f in faults
        if f.get("parked") and "armed_at" in f["parked"]
    ]
    out: dict[str, Any] = {
        "resumes_total": len(resumes),
        "mean_gap_between_faults_s": round(gap, 2),
        "takeover_window_mean_s": round(window, 3),
        "interrupting_faults": len(hitting),
        "interrupted_expected_by_chance": round(len(resumes) * window / gap / config["workers"], 1),
        "faults_landing_on_a_takeover": on_takeover,
        "faults_landing_on_a_takeover_expected_by_chance": round(
            len(faults) * len(resumes) / max(1, steps_run), 1
        ),
    }
    if waits:
        out["arm_wait_s_p50"] = round(statistics.median(waits), 2)
        out["arm_waits_over_1s"] = sum(1 for w in waits if w > 1.0)
    return out


def load(path: Path) -> dict[str, Any]:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    data: dict[str, Any] = json.loads(raw)
    return data


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        trace = load(Path(arg))
        steps = len(trace["effects"])  # of the instances a fault hit: a lower bound
        flows = trace["config"]["flows"]
        # Every flow runs its four steps once, plus the re-runs: effects of hit instances
        # beyond their four.
        hit = {e[0] for e in trace["effects"]}
        steps = flows * 4 + (steps - 4 * len(hit))
        print(arg, json.dumps(interruption_model(trace, steps), indent=1))
