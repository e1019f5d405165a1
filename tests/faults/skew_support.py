"""Real ``flowx worker`` processes with a skewed clock, and what the tests read about them.

A skewed worker runs under libfaketime — what ``faketime -m -f +3`` sets up, preloaded
into the worker itself: the ``faketime`` wrapper stays the parent of the program it runs and
passes on no signal, so a SIGKILL sent to it would leave the worker running. Only the wall
clock is off (``FAKETIME_DONT_FAKE_MONOTONIC=1``), as with a node whose NTP is broken; its
monotonic clock — on which a lease's local liveness is judged (R3.2) — stays real.
``NO_FAKE_STAT=1`` keeps file times real, so Python does not recompile its bytecode.

``LeaseWatch`` polls the lease store from the test process, every 50 ms, and keeps every
``(owner, token)`` it saw for each instance with the store's clock at the time: the history of
who held what, and when, on the one clock that decides it (R9.2).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import flowx
from tests.faults.skew_flows import LEDGER, Job, prepare_ledger

ROOT = Path(__file__).resolve().parents[2]
FLOWS = "tests.faults.skew_flows:FLOWS"
#: The thread-safe libfaketime (a worker has threads), wherever this machine's multiarch put it.
LIBFAKETIME = sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))


def need_faketime() -> Path:
    """libfaketime, or skip saying why there is none."""
    if not LIBFAKETIME:
        pytest.skip(
            "libfaketime is not installed (no /usr/lib/*/faketime/libfaketimeMT.so.1; Debian "
            "package 'faketime', which scripts/services.sh installs): the clock-skew tests "
            "need a worker whose wall clock is really off"
        )
    return LIBFAKETIME[0]


def skewed_env(skew: float) -> dict[str, str]:
    """The environment that puts a process's wall clock ``skew`` seconds ahead (negative:
    behind), and nothing else."""
    return {
        "LD_PRELOAD": str(need_faketime()),
        "FAKETIME": f"{skew:+g}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "NO_FAKE_STAT": "1",
    }


@dataclass
class Worker:
    """One ``flowx worker`` process, its log in a file (never a pipe that could fill)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    ready: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"worker {self.name} exited ({self.proc.returncode}) before it was ready:\n"
                    + self.output()
                )
            assert time.monotonic() < deadline, f"worker {self.name} not ready in {timeout}s"
            time.sleep(0.02)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=10) == -signal.SIGKILL

    def stop(self) -> None:
        """SIGTERM (a drain), then SIGKILL if it does not end within 20 s."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def offset(self) -> float:
        """The offset this worker measured to the journal's clock at start, in seconds
        (positive: this node is ahead), from its log: the proof that the skew was real."""
        m = re.search(r"this node's clock is ([0-9.]+)s (ahead of|behind) ", self.output())
        assert m, f"worker {self.name} logged no clock offset:\n{self.output()}"
        return float(m.group(1)) * (1 if m.group(2) == "ahead of" else -1)

    def lost_lines(self) -> list[str]:
        """Log lines that say a lease was lost or not renewed."""
        return [
            line
            for line in self.output().splitlines()
            if re.search(r"lease.* lost|LeaseLost|not renewed", line)
        ]


def start_worker(
    work: Path,
    db: str,
    name: str,
    *,
    ttl: float,
    scan: float,
    leases: str | None = None,
    skew: float | None = None,
    max_offset: float | None = None,
    step_seconds: float = 0.0,
    flows: str = FLOWS,
    log_level: str = "info",
) -> Worker:
    """A worker named ``name`` (its ``--node-id``, so ``flow_lease.owner_node`` says who).

    ``skew`` seconds puts its wall clock that far ahead (negative: behind) under libfaketime.
    """
    env = {
        **os.environ,
        "FAULT_DIR": str(work),
        "FAULT_NODE": name,
        "FAULT_STEP_SECONDS": str(step_seconds),
        "FLOWX_LEASE_TTL": f"{int(ttl * 1000)}ms",
        "FLOWX_RECOVERY_SCAN_INTERVAL": f"{int(scan * 1000)}ms",
        "FLOWX_TIMER_POLL_INTERVAL": f"{int(scan * 1000)}ms",
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
        ),
    }
    if max_offset is not None:
        env["FLOWX_MAX_CLOCK_OFFSET"] = f"{int(max_offset * 1000)}ms"
    if skew is not None:
        env.update(skewed_env(skew))
    prepare_ledger(work)
    log = work / f"worker-{name}.log"
    ready = work / f"ready-{name}"
    command = [
        sys.executable,
        "-m",
        "flowx.cli.main",
        "worker",
        "--db",
        db,
        "--flows",
        flows,
        "--node-id",
        name,
        "--ready-file",
        str(ready),
        "--log-level",
        log_level,
    ]
    if leases is not None:
        command += ["--leases", leases]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    return Worker(name=name, proc=proc, log=log, ready=ready)


def figure(test: str, **values: object) -> None:
    """A measured figure (a takeover time, a commit rate): printed, so a failing test shows
    it, and appended as a JSON line to ``$FLOWX_FAULT_FIGURES`` when that is set. Figures
    are reported, never asserted on."""
    line = json.dumps({"test": test, **values}, default=str)
    print(line)
    target = os.environ.get("FLOWX_FAULT_FIGURES")
    if target:
        with Path(target).open("a") as out:
            out.write(line + "\n")


def wait_until(
    check: Callable[[], bool], timeout: float, what: str, *, workers: Iterable[Worker] = ()
) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` (and any worker that died)."""
    deadline = time.monotonic() + timeout
    watched = list(workers)
    while not check():
        for w in watched:
            if not w.alive():
                raise AssertionError(
                    f"worker {w.name} exited ({w.proc.returncode}) while waiting for {what}:\n"
                    + w.output()
                )
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {w.name}\n{w.output()[-3000:]}" for w in watched)
            raise AssertionError(f"{what}: not within {timeout:g}s\n{logs}")
        time.sleep(0.05)


# --- the ledger -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Effect:
    instance_id: str
    step: str
    attempt: int
    node: str
    pid: int


def effects(work: Path) -> list[Effect]:
    path = work / LEDGER
    if not path.exists():
        return []
    conn = sqlite3.connect(path, timeout=30)
    try:
        try:
            rows = conn.execute(
                "SELECT instance_id, step, attempt, node, pid FROM ledger ORDER BY rowid"
            ).fetchall()
        except sqlite3.OperationalError:  # no table yet
            return []
    finally:
        conn.close()
    return [Effect(*r) for r in rows]


# --- the lease store, seen from outside -----------------------------------------------------


@dataclass
class Holding:
    """One ``(owner, token)`` of an instance's lease, as the watch saw it."""

    owner: str
    token: int
    first_seen: datetime  # store clock
    last_expires: datetime  # store clock


@dataclass
class LeaseWatch:
    """Polls every lease of one journal schema (PostgreSQL) or key prefix (Redis)."""

    db: str
    schema: str
    redis_url: str | None = None
    prefix: str | None = None
    history: dict[str, list[Holding]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    error: BaseException | None = None

    def start(self) -> LeaseWatch:
        self._thread = threading.Thread(target=self._run, name="lease-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.error is not None:
            raise AssertionError(f"the lease watch failed: {self.error!r}")

    def holders(self, instance_id: str, *, besides: str | None = None) -> list[Holding]:
        with self._lock:
            seen = list(self.history.get(instance_id, []))
        return [h for h in seen if h.owner != besides]

    def _note(
        self, instance_id: str, owner: str, token: int, expires: datetime, at: datetime
    ) -> None:
        with self._lock:
            seen = self.history.setdefault(instance_id, [])
            if seen and seen[-1].owner == owner and seen[-1].token == token:
                seen[-1].last_expires = max(seen[-1].last_expires, expires)
            else:
                seen.append(Holding(owner, token, at, expires))

    def _run(self) -> None:
        try:
            if self.redis_url is None:
                self._run_postgres()
            else:
                self._run_redis()
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def _run_postgres(self) -> None:
        import psycopg

        query = (
            f"SELECT instance_id::text, owner_node, fencing_token, expires_at, clock_timestamp() "
            f'FROM "{self.schema}".flow_lease'
        )
        with psycopg.connect(self.db, autocommit=True) as conn:
            while not self._stop.is_set():
                for iid, owner, token, expires, at in conn.execute(query):  # type: ignore[arg-type]
                    self._note(iid, owner, int(token), expires, at)
                self._stop.wait(0.05)

    def _run_redis(self) -> None:
        import redis

        assert self.redis_url is not None
        client = redis.Redis.from_url(self.redis_url)
        pattern = f"{self.prefix}:lease:*"
        try:
            while not self._stop.is_set():
                keys = list(client.scan_iter(match=pattern, count=500))
                if keys:
                    with client.pipeline(transaction=False) as pipe:
                        pipe.time()
                        for k in keys:
                            pipe.hmget(k, "owner", "token", "expires")
                        seconds_micros, *values = pipe.execute()
                    at = _from_ms(int(seconds_micros[0]) * 1000 + int(seconds_micros[1]) // 1000)
                    for k, (owner, token, expires) in zip(keys, values, strict=True):
                        if owner is None or token is None:
                            continue
                        iid = k.decode().rsplit(":", 1)[1]
                        self._note(iid, owner.decode(), int(token), _from_ms(int(expires)), at)
                self._stop.wait(0.05)
        finally:
            client.close()


def _from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


# --- the journal ----------------------------------------------------------------------------

_ENDED = {"Completed", "Failed", "CompensationFailed", "TimedOut"}


@dataclass
class Backend:
    """One journal (a PostgreSQL schema) and where its leases live."""

    name: str
    pg_dsn: str
    schema: str
    redis_url: str | None = None  # with ?flowx_prefix=
    prefix: str | None = None
    redis_plain: str | None = None

    @property
    def db(self) -> str:
        return f"{self.pg_dsn}?flowx_schema={self.schema}"

    @property
    def leases(self) -> str | None:
        return self.redis_url

    def stores(self) -> Any:
        return flowx.from_url(self.db, leases=self.leases)

    def watch(self) -> LeaseWatch:
        return LeaseWatch(
            db=self.pg_dsn, schema=self.schema, redis_url=self.redis_plain, prefix=self.prefix
        ).start()

    def now(self) -> datetime:
        """The clock that decides the leases: PostgreSQL's, or Redis's ``TIME``."""
        if self.redis_plain is not None:
            import redis

            client = redis.Redis.from_url(self.redis_plain)
            try:
                seconds, micros = client.time()
            finally:
                client.close()
            return _from_ms(int(seconds) * 1000 + int(micros) // 1000)
        return self.sql("SELECT clock_timestamp()")[0][0]  # type: ignore[no-any-return]

    def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.pg_dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path = "{self.schema}"')  # type: ignore[arg-type]
            return list(conn.execute(query, args))  # type: ignore[arg-type]

    def states(self, ids: Iterable[str]) -> dict[str, str]:
        rows = self.sql(
            "SELECT instance_id::text, state FROM flow_instance "
            "WHERE instance_id = ANY(%s::uuid[])",
            list(ids),
        )
        return dict(rows)  # type: ignore[arg-type]

    def all_in(self, ids: Iterable[str], state: str) -> Callable[[], bool]:
        """A check that every instance is in ``state``; it fails at once if one has ended
        in another state, saying why."""
        wanted = list(ids)

        def check() -> bool:
            states = self.states(wanted)
            ended = [i for i, s in states.items() if s != state and s in _ENDED]
            if ended:
                why = self.sql(
                    "SELECT instance_id::text, state, error::text FROM flow_instance "
                    "WHERE instance_id = ANY(%s::uuid[])",
                    ended,
                )
                raise AssertionError(f"instances ended otherwise than {state}: {why}")
            return len(states) == len(wanted) and set(states.values()) == {state}

        return check

    def step_rows(self, instance_id: str) -> list[tuple[str, int, str]]:
        return [
            (str(name), int(attempt), str(outcome))
            for name, attempt, outcome in self.sql(
                "SELECT step_name, attempt, outcome FROM flow_step WHERE instance_id = %s "
                "ORDER BY sequence",
                instance_id,
            )
        ]

    def queue(self, plan: flowx.Plan, count: int, *, node: str = "queue") -> list[str]:
        """Start ``count`` instances for any worker (``Pending``), as ``flowx start`` does;
        all at once, so a slow journal commits them together."""

        async def go() -> list[str]:
            async with flowx.FlowHost(
                store=self.stores(),
                flows=[plan],
                settings=flowx.HostSettings.load(recovery=False, timers=False, node_id=node),
            ) as host:
                handles = await asyncio.gather(
                    *(host.start(plan, Job(n=i), run_here=False) for i in range(count))
                )
                return [h.instance_id for h in handles]

        return asyncio.run(go())
