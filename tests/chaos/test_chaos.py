"""The chaos rig at CI size: every arm of issues 4 and 12, real processes, real servers (R2.4,
R3.5, R4.3, R7.2, R9.1, R9.2, SPEC §8). The full-size run is ``python -m benchmarks.chaos``.

Each arm starts worker processes on a fresh PostgreSQL cluster of its own (never the shared
server: arms restart it), feeds them flows whose every step records a non-idempotent effect
in a ledger table, injects its fault, waits until every instance has settled and then checks
the invariants in SQL. Issue 12's arms: a COMMIT whose reply a fault proxy swallows
(``commit_no_reply``), workers under libfaketime at ±TTL/2 (``clock_skew``), Redis leases gone
for 3 × TTL under long steps (``lease_store_outage``).

The test runs the benchmark as a program (``python -m benchmarks.chaos --quick --only ARM``,
the arm's CI size is defined there) and asserts on the JSON it writes: every invariant the rig
reports holds, and every planned fault was injected. Tests never import ``benchmarks``
(``tests/test_structure.py``): the benchmark is a tool the test drives, not a library.
"""

from __future__ import annotations

import ast
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.crash, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
#: Leaves the benchmark time to stop its servers (on SIGINT) before pytest's own timeout.
RUN_TIMEOUT = 270.0


def ci_arms() -> list[str]:
    """The arms ``--quick`` runs: the keys of ``CI_ARMS`` in ``benchmarks/chaos.py``, read from
    its source (a test never imports the benchmarks), so a new arm is tested without being
    listed twice."""
    tree = ast.parse((ROOT / "benchmarks" / "chaos.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "CI_ARMS" for t in targets):
                return [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
    raise AssertionError("benchmarks/chaos.py has no CI_ARMS dict")


ARMS = ci_arms()


def run_arm(arm: str, out: Path) -> tuple[dict[str, Any], str]:
    """One arm at CI size in its own process; its row of ``out`` and what it printed."""
    command = [sys.executable, "-m", "benchmarks.chaos", "--quick", "--only", arm]
    proc = subprocess.Popen(
        [*command, "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        printed, _ = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # its ``finally`` stops the arm's servers
        try:
            printed, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            printed, _ = proc.communicate()
        pytest.fail(f"{arm}: the rig did not finish in {RUN_TIMEOUT:.0f} s\n{printed}")
    assert proc.returncode == 0, f"{arm}: the rig exited {proc.returncode}\n{printed}"
    runs = json.loads(out.read_text())["runs"]
    assert [r["arm"] for r in runs] == [arm], f"{arm}: no run of this arm in {out}\n{printed}"
    return runs[0], printed


@pytest.mark.parametrize("arm", ARMS)
def test_chaos_arm(arm: str, tmp_path: Path) -> None:
    result, printed = run_arm(arm, tmp_path / "chaos.json")
    print(printed)
    print(json.dumps(result, indent=2))
    failed = [name for name, ok in result["invariants"].items() if not ok]
    assert not failed, f"{arm}: {failed}\n{json.dumps(result, indent=2)}"
    per_fault = 2 if arm == "kill_during_takeover" else 1  # two kills each
    assert result["faults"] == result["faults_planned"] * per_fault  # all really injected
