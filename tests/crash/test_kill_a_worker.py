"""A real worker process is SIGKILLed at a chosen instruction; another process finishes
the instance (R4.3, SPEC §8 "node crash mid-step").

Measured, not asserted: the ledger outside the journal counts how many times each effect
really happened.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import flowx
from tests.crash.crash_flows import Job, job
from tests.crash.workers import start_worker
from tests.postgres_support import PG_DSN

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]


def _worker(db: str, crash_dir: Path) -> subprocess.Popen[bytes]:
    return start_worker(db, crash_dir, "tests.crash.crash_flows:FLOWS")


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise AssertionError(f"worker exited early ({proc.returncode}): {out}")
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def _effects(crash_dir: Path) -> dict[str, int]:
    conn = sqlite3.connect(crash_dir / "ledger.db")
    try:
        return dict(conn.execute("SELECT step, count(*) FROM ledger GROUP BY step"))
    finally:
        conn.close()


async def _queue(db: str) -> str:
    async with flowx.FlowHost(
        store=flowx.from_url(db),
        flows=[job],
        settings=flowx.HostSettings.load(recovery=False),
    ) as host:
        handle = await host.start(job, Job(name="victim"), run_here=False)
        return handle.instance_id


async def _final(db: str, instance_id: str, timeout: float = 30) -> flowx.InstanceState:
    stores = flowx.from_url(db)
    await stores.open()
    try:
        deadline = time.monotonic() + timeout
        while True:
            record = await stores.journal.get(instance_id)
            assert record is not None
            if record.state.terminal or time.monotonic() > deadline:
                return record.state
            await asyncio.sleep(0.05)
    finally:
        await stores.close()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path, pg_schema: Callable[[], str]) -> str:
    """The same kill, on the embedded journal and on the production one."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'flowx.db'}"
    return f"{PG_DSN}?flowx_schema={pg_schema()}"


def _run_crash(
    tmp_path: Path, db: str, park: str
) -> tuple[flowx.InstanceState, dict[str, int], int]:
    crash = tmp_path
    (crash / park).write_text("")
    instance_id = asyncio.run(_queue(db))
    first = _worker(db, crash)
    second: subprocess.Popen[bytes] | None = None
    try:
        _wait_for(crash / f"parked-{park.rsplit('-', 1)[1]}", first)
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL
        second = _worker(db, crash)
        state = asyncio.run(_final(db, instance_id))
        second.send_signal(signal.SIGTERM)
        rc = second.wait(timeout=30)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    return state, _effects(crash), rc


def test_a_kill_between_effect_and_commit_re_executes_that_step_exactly_once(
    tmp_path: Path, store_url: str
) -> None:
    state, effects, rc = _run_crash(tmp_path, store_url, "park-after-effect-b")
    assert state is flowx.InstanceState.COMPLETED
    assert effects == {"a": 1, "b": 2, "c": 1}  # one kill in the window: one duplicate
    assert rc == 0  # the second worker drained and exited cleanly on SIGTERM (R7.2)


def test_a_kill_after_a_commit_duplicates_nothing(tmp_path: Path, store_url: str) -> None:
    state, effects, rc = _run_crash(tmp_path, store_url, "park-before-effect-c")
    assert state is flowx.InstanceState.COMPLETED
    assert effects == {"a": 1, "b": 1, "c": 1}
    assert rc == 0
