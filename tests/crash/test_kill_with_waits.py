"""A real worker is SIGKILLed while it has instances suspended on a signal, asleep on a durable
timer and in the middle of a compensation; a second worker process finishes every one of them
correctly (SPEC §8 "node crash"; R2.10, R2.11, R3.4).

Timeline, per backend (SQLite and PostgreSQL):

1. N instances of each flow of ``wait_flows`` are queued ``Pending``; worker 1 takes them.
2. Once every ``signal`` instance is Suspended on ``go``, every ``sleep`` instance Suspended
   with a ``wake_at``, and every ``saga`` instance Compensating and parked inside ``undo_a``
   (after its effect, before its commit), worker 1 is SIGKILLed — before any sleeper is due.
3. With no worker running, the signals for some instances are delivered (they must wake the
   instance to ``Pending``, not be lost), and the test waits until a sleeper is already due:
   a worker started after the wake time must wake it late, not never.
4. Worker 2 starts; the remaining signals are delivered while it runs; the rest of the
   sleepers come due while it runs; the sagas' dead leases expire and it finishes their
   compensation.
5. Every instance must end in the right state, and the ledger (outside the journal) must show
   each effect the right number of times, made by the right process.

Signals are delivered through the journal's ``WaitStore.signal`` — what ``FlowHost.signal``
writes — rather than through a ``FlowHost`` in the test process: ``FlowHost.signal`` resumes a
woken instance *on the signalling host* when it carries the flow, so the test process itself
would run step ``b`` and the test would no longer show that another *worker* finished it.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

import flowx
from flowx.stores.records import InstanceRecord, Outcome, StepRecord
from tests.crash.wait_flows import (
    FLOWS,
    Go,
    Item,
    parked_marker,
    saga_flow,
    signal_flow,
    sleep_flow,
)
from tests.crash.workers import start_worker
from tests.postgres_support import PG_DSN

T = TypeVar("T")

#: Each run spawns two Python worker processes and takes about 6 s per backend (measured on the
#: dev machine: 5.4-6.4 s). The bounded waits inside add up to at most ~110 s (30 s for the
#: kill point, ~3 s for the first wake, 10 s for readiness, 45 s to finish, 20 s to drain), so
#: they fail first with a message naming the stuck instances; this limit only catches a hang
#: outside them (a store call that never returns).
pytestmark = [pytest.mark.crash, pytest.mark.timeout(150)]

ROOT = Path(__file__).resolve().parents[2]
N = 5  # instances of each flow
#: Step ``a`` of sleeper ``i`` takes ``i * STAGGER`` s: the sleepers seal (and come due) 0.4 s
#: apart, so the first is due before worker 2 starts and the last ones while it runs, and the
#: last seals 1.4 s before the first is due (the window in which worker 1 must be killed).
STAGGER = 0.4
#: Signal instances whose signal is delivered while no worker runs; the rest while worker 2 is up.
EARLY_SIGNALS = 2


def _worker(db: str, crash_dir: Path, name: str) -> subprocess.Popen[bytes]:
    ready = str(crash_dir / f"ready-{name}")
    return start_worker(
        db,
        crash_dir,
        "tests.crash.wait_flows:FLOWS",
        extra_args=("--node-id", name, "--ready-file", ready),
    )


def _output(proc: subprocess.Popen[bytes]) -> str:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    return proc.stdout.read().decode(errors="replace") if proc.stdout else ""


def _check_alive(proc: subprocess.Popen[bytes], what: str) -> None:
    if proc.poll() is not None:
        raise AssertionError(f"{what} exited early ({proc.returncode}):\n{_output(proc)}")


@dataclass(frozen=True)
class Effect:
    instance_id: str
    step: str
    attempt: int
    compensating: bool
    pid: int
    at: float


def _ledger(crash_dir: Path) -> list[Effect]:
    path = crash_dir / "ledger.db"
    if not path.exists():
        return []
    conn = sqlite3.connect(path, timeout=30)
    try:
        rows = conn.execute(
            "SELECT instance_id, step, attempt, compensating, pid, at FROM ledger ORDER BY at"
        ).fetchall()
    finally:
        conn.close()
    return [Effect(r[0], r[1], r[2], bool(r[3]), r[4], r[5]) for r in rows]


class _Journal:
    """The journal as the test reads it: one open store on one event loop."""

    def __init__(self, runner: asyncio.Runner, db: str) -> None:
        self.runner = runner
        self.db = db
        self.stores = flowx.from_url(db)
        self.run(self.stores.open())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    def get(self, instance_id: str) -> InstanceRecord:
        record = self.run(self.stores.journal.get(instance_id))
        assert record is not None, f"instance {instance_id} vanished from the journal"
        return record

    def records(self, ids: list[str]) -> dict[str, InstanceRecord]:
        return {iid: self.get(iid) for iid in ids}

    def steps(self, instance_id: str) -> list[StepRecord]:
        return list(self.run(self.stores.journal.steps(instance_id)))

    def signal(self, instance_id: str, token: str) -> str:
        return self.run(self._signal(instance_id, token))

    async def _signal(self, instance_id: str, token: str) -> str:
        # As `flowx signal` does: checked against the plan, and left Pending for the workers
        # (run_here=False), so no effect of the flow ever runs in this test's own process.
        async with flowx.FlowHost(
            store=flowx.from_url(self.db),
            flows=FLOWS,
            settings=flowx.HostSettings.load(recovery=False, timers=False),
        ) as host:
            receipt = await host.signal(
                instance_id, "go", Go(token=token), key=f"go-{instance_id}", run_here=False
            )
        return str(receipt.status)

    def close(self) -> None:
        self.run(self.stores.close())


async def _queue(db: str) -> dict[str, list[str]]:
    """Queue N instances of each flow, Pending, from a host that runs nothing itself."""
    ids: dict[str, list[str]] = {}
    async with flowx.FlowHost(
        store=flowx.from_url(db),
        flows=FLOWS,
        settings=flowx.HostSettings.load(recovery=False, timers=False),
    ) as host:
        for kind, plan in (("signal", signal_flow), ("sleep", sleep_flow), ("saga", saga_flow)):
            ids[kind] = []
            for i in range(N):
                delay = STAGGER * i if kind == "sleep" else 0.0
                handle = await host.start(
                    plan, Item(name=f"{kind}-{i}", delay=delay), run_here=False
                )
                ids[kind].append(handle.instance_id)
    return ids


def _describe(records: dict[str, InstanceRecord], ids: dict[str, list[str]]) -> str:
    lines = []
    for kind, group in ids.items():
        for i, iid in enumerate(group):
            r = records.get(iid)
            if r is None:
                lines.append(f"  {kind}-{i} {iid}: (not read)")
                continue
            lines.append(
                f"  {kind}-{i} {iid}: {r.state.value} wake_at={r.wake_at} "
                f"wake_signal={r.wake_signal} error={r.error}"
            )
    return "\n".join(lines)


def _poll(
    check: Callable[[], tuple[bool, str]],
    *,
    timeout: float,
    what: str,
    alive: list[tuple[subprocess.Popen[bytes], str]],
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        done, detail = check()
        if done:
            return
        for proc, name in alive:
            _check_alive(proc, name)
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout:.0f}s:\n{detail}")
        time.sleep(0.05)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path, pg_schema: Callable[[], str]) -> str:
    """The same kill, on the embedded journal and on the production one."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'flowx.db'}"
    return f"{PG_DSN}?flowx_schema={pg_schema()}"


def test_a_killed_worker_loses_no_suspended_sleeping_or_compensating_instance(
    tmp_path: Path, store_url: str
) -> None:
    crash = tmp_path / "crash"
    crash.mkdir()
    (crash / "park-undo_a").write_text("")
    ids = asyncio.run(_queue(store_url))
    everyone = [iid for group in ids.values() for iid in group]
    started = time.monotonic()
    first = _worker(store_url, crash, "worker-1")
    second: subprocess.Popen[bytes] | None = None
    with asyncio.Runner() as runner:
        journal = _Journal(runner, store_url)
        try:
            # -- 1. worker 1 reaches every wait --------------------------------------------
            def at_kill_point() -> tuple[bool, str]:
                records = journal.records(everyone)
                ok = (
                    all(
                        records[i].state is flowx.InstanceState.SUSPENDED
                        and records[i].wake_signal == "go"
                        for i in ids["signal"]
                    )
                    and all(
                        records[i].state is flowx.InstanceState.SUSPENDED
                        and records[i].wake_at is not None
                        and records[i].wake_signal is None
                        for i in ids["sleep"]
                    )
                    and all(
                        records[i].state is flowx.InstanceState.COMPENSATING
                        and parked_marker(crash, i).exists()
                        for i in ids["saga"]
                    )
                )
                return ok, _describe(records, ids)

            _poll(
                at_kill_point,
                timeout=30,
                what="every instance suspended, asleep or parked in undo_a on worker 1",
                alive=[(first, "worker 1")],
            )
            first.send_signal(signal.SIGKILL)
            killed_at = time.time()
            assert first.wait(timeout=10) == -signal.SIGKILL, "worker 1 did not die by SIGKILL"
            first_pid = first.pid

            at_kill = journal.records(everyone)
            due_at: dict[str, float] = {}
            for iid in ids["sleep"]:
                wake = at_kill[iid].wake_at
                assert wake is not None, f"sleeper {iid} lost its wake_at"
                due_at[iid] = wake.timestamp()
            earliest = min(due_at.values())
            assert killed_at < earliest, (
                f"worker 1 was killed {killed_at - earliest:.2f}s after the first sleeper was "
                "due: the kill point came too late to catch every sleeper asleep"
            )
            before = _ledger(crash)
            done_before = Counter(e.step for e in before)
            assert done_before == {"a": 3 * N, "undo_a": N}, (
                f"effects when worker 1 was killed: {dict(done_before)}; expected every a and "
                "one undo_a per saga (parked after its effect), no b"
            )
            assert {e.pid for e in before} == {first_pid}

            # -- 2. signals while no worker runs; a sleeper comes due meanwhile ------------
            receipts: dict[str, str] = {}
            for i, iid in enumerate(ids["signal"][:EARLY_SIGNALS]):
                receipts[iid] = journal.signal(iid, f"tok-{i}")
            assert set(receipts.values()) == {"woken"}, receipts
            # A redelivery with the same key writes nothing.
            assert journal.signal(ids["signal"][0], "tok-0") == "duplicate"
            for iid in ids["signal"][:EARLY_SIGNALS]:
                state = journal.get(iid).state
                assert state is flowx.InstanceState.PENDING, f"signalled {iid} is {state}"
            while time.time() < due_at[ids["sleep"][0]] + 0.1:
                time.sleep(0.05)

            # -- 3. worker 2 -----------------------------------------------------------------
            second_started = time.time()
            second = proc2 = _worker(store_url, crash, "worker-2")
            _poll(
                lambda: ((crash / "ready-worker-2").exists(), "no ready file"),
                timeout=10,
                what="worker 2 ready",
                alive=[(proc2, "worker 2")],
            )
            second_ready = time.time()
            for i, iid in enumerate(ids["signal"][EARLY_SIGNALS:], start=EARLY_SIGNALS):
                receipts[iid] = journal.signal(iid, f"tok-{i}")
            assert len(receipts) == N
            assert set(receipts.values()) == {"woken"}, receipts

            def all_terminal() -> tuple[bool, str]:
                records = journal.records(everyone)
                return all(r.state.terminal for r in records.values()), _describe(records, ids)

            _poll(
                all_terminal,
                timeout=45,
                what="every instance terminal on worker 2",
                alive=[(proc2, "worker 2")],
            )
            final = journal.records(everyone)
            steps = {iid: journal.steps(iid) for iid in everyone}
            finished = time.monotonic()
            proc2.send_signal(signal.SIGTERM)
            rc = proc2.wait(timeout=20)
            second_pid = proc2.pid
        finally:
            for proc in (first, second):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
            journal.close()

    out2 = _output(proc2)
    assert rc == 0, f"worker 2 did not drain cleanly on SIGTERM (rc={rc}):\n{out2}"

    # -- 4. the journal ------------------------------------------------------------------------
    assert sum(r.state.terminal for r in final.values()) == 3 * N, _describe(final, ids)
    for i, iid in enumerate(ids["signal"]):
        r = final[iid]
        assert r.state is flowx.InstanceState.COMPLETED, f"signal-{i}: {r.state} {r.error}"
        bag = json.loads(r.state_bag)
        assert bag == {"a": "a-done", "b": "b-done", "go": {"token": f"tok-{i}"}}, (i, bag)
    for i, iid in enumerate(ids["sleep"]):
        r = final[iid]
        assert r.state is flowx.InstanceState.COMPLETED, f"sleep-{i}: {r.state} {r.error}"
        bag = json.loads(r.state_bag)
        assert bag == {"a": "a-done", "b": "b-done", "go": None}, (i, bag)
    for i, iid in enumerate(ids["saga"]):
        r = final[iid]
        assert r.state is flowx.InstanceState.FAILED, f"saga-{i}: {r.state} {r.error}"
        assert r.error is not None and "boom" in r.error, r.error
        rows = Counter((s.step_name, s.outcome) for s in steps[iid])
        assert rows == {
            ("a", Outcome.SUCCESS): 1,
            ("boom", Outcome.FAILURE): 1,  # NonRetryableError: one attempt, no retry
            ("a", Outcome.COMPENSATED): 1,
        }, (i, rows)

    # -- 5. the ledger: what really happened, and where -----------------------------------
    effects = _ledger(crash)
    by: dict[tuple[str, str], list[Effect]] = {}
    for e in effects:
        by.setdefault((e.instance_id, e.step), []).append(e)
    assert not [e for e in effects if e.step == "boom"], "boom produced an effect"
    assert {e.instance_id for e in effects} == set(everyone)
    for iid in everyone:
        a = by.get((iid, "a"), [])
        assert len(a) == 1 and a[0].pid == first_pid and not a[0].compensating, (iid, a)
    for kind in ("signal", "sleep"):
        for i, iid in enumerate(ids[kind]):
            b = by.get((iid, "b"), [])
            assert len(b) == 1, f"{kind}-{i}: step b happened {len(b)} times"
            assert b[0].pid == second_pid, f"{kind}-{i}: b ran in pid {b[0].pid}, not worker 2"
            assert (iid, "undo_a") not in by, f"{kind}-{i} compensated"
    for i, iid in enumerate(ids["sleep"]):
        woke = by[(iid, "b")][0].at
        assert woke >= due_at[iid], f"sleep-{i} woke {due_at[iid] - woke:.2f}s early"
    # Deterministic: the test waited for the first sleeper's wake time before starting worker 2.
    late = [i for i, iid in enumerate(ids["sleep"]) if due_at[iid] < second_started]
    assert late, "no sleeper was due before worker 2 started"
    for i, iid in enumerate(ids["saga"]):
        undo = by.get((iid, "undo_a"), [])
        # Parked after its effect: the dead worker's effect, then the re-execution's.
        assert [(u.pid, u.compensating) for u in undo] == [
            (first_pid, True),
            (second_pid, True),
        ], f"saga-{i}: undo_a effects {undo}"
        assert (iid, "b") not in by

    on_time = [i for i, iid in enumerate(ids["sleep"]) if due_at[iid] > second_ready]
    print(
        f"\n{store_url.split(':', 1)[0]}: all {3 * N} finished {finished - started:.1f}s after "
        f"worker 1 started; sleepers due before worker 2 started: {late}, due after it was "
        f"ready: {on_time}; kill {earliest - killed_at:.2f}s before the first wake; undo_a "
        f"attempts {sorted({e.attempt for e in effects if e.step == 'undo_a'})}"
    )
