"""The chaos rig at CI size: every arm of issues 4 and 12, real processes, real servers (R2.4,
R3.5, R4.3, R7.2, R9.1, R9.2, SPEC §8). The full-size run is ``python -m benchmarks.chaos``.

Each arm starts worker processes on a fresh PostgreSQL cluster of its own (never the shared
server: arms restart it), feeds them flows whose every step records a non-idempotent effect
in a ledger table, injects its fault, waits until every instance has settled and then checks
the invariants in SQL (``benchmarks.rig.checks``). Issue 12's arms: a COMMIT whose reply a
fault proxy swallows (``commit_no_reply``), workers under libfaketime at ±TTL/2
(``clock_skew``), Redis leases gone for 3 × TTL under long steps (``lease_store_outage``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.rig.checks import invariants
from benchmarks.rig.controller import Rig
from benchmarks.rig.model import RigConfig

pytestmark = [pytest.mark.crash, pytest.mark.timeout(300)]

CI_ARMS = {
    "kill_after_effect": RigConfig(arm="kill_after_effect", flows=500, faults=3),
    "kill_after_commit": RigConfig(arm="kill_after_commit", flows=500, faults=3),
    # Each fault here lasts a TTL or more: a slower feed keeps work in flight throughout.
    "zombie": RigConfig(arm="zombie", flows=400, faults=2, rate=40),
    "kill_during_takeover": RigConfig(arm="kill_during_takeover", flows=400, faults=2, rate=40),
    "postgres_restart": RigConfig(arm="postgres_restart", flows=500, faults=1),
    # Slower steps, so instances are mid-flight when Redis goes away for a whole TTL: their
    # leases run out, they abort, and are taken again from a Redis that forgot every counter.
    "redis_restart": RigConfig(
        arm="redis_restart", flows=500, faults=2, redis_leases=True, work_ms=(150, 300)
    ),
    # A long TTL, so "resumed within one TTL" can only come from the hand-back (R7.2). A
    # slower feed, so a SIGTERM always finds instances in flight to hand back: at full speed
    # the 500 flows can all be done before the second one lands, leaving nothing to measure.
    "sigterm_drain": RigConfig(arm="sigterm_drain", flows=500, faults=2, ttl=20.0, rate=40),
    # Issue 12 item 1: a step's COMMIT runs on the server and its reply never comes back.
    "commit_no_reply": RigConfig(arm="commit_no_reply", flows=400, faults=2, rate=40),
    # Item 2: one worker's clock TTL/2 ahead, one TTL/2 behind; kills aimed at those two.
    "clock_skew": RigConfig(
        arm="clock_skew", flows=400, faults=2, ttl=4.0, rate=40, skews=(2.0, -2.0, 0.0)
    ),
    # Item 3: Redis leases gone for 3 x TTL while steps outlast a renewal interval.
    "lease_store_outage": RigConfig(
        arm="lease_store_outage",
        flows=300,
        faults=1,
        rate=40,
        redis_leases=True,
        work_ms=(1200, 1500),
    ),
}


@pytest.mark.parametrize("arm", list(CI_ARMS))
async def test_chaos_arm(arm: str, tmp_path: Path) -> None:
    rig = Rig(CI_ARMS[arm], tmp_path / arm)
    try:
        result = await rig.run()
        print(json.dumps(result, indent=2))
        checks = invariants(result)
        failed = [name for name, ok in checks.items() if not ok]
        assert not failed, f"{arm}: {failed}\n{json.dumps(result, indent=2)}"
        per_fault = 2 if arm == "kill_during_takeover" else 1  # two kills each
        assert result["faults"] == CI_ARMS[arm].faults * per_fault  # all really injected
    finally:
        rig.cleanup()
