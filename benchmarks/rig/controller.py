"""The controller: starts worker processes, feeds them flows, injects one kind of fault, and
checks the invariants in SQL once every instance has settled.

It never calls into a worker: it sees the workers only as processes (signals), files they
write (ready, parked) and rows in PostgreSQL — as an operator would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

import flowx
from benchmarks.rig.flows import STEPS, Order, order
from benchmarks.rig.services import RigServers

ROOT = Path(__file__).resolve().parents[2]
ARMS = (
    "kill_after_effect",
    "kill_after_commit",
    "zombie",
    "kill_during_takeover",
    "postgres_restart",
    "redis_restart",
    "sigterm_drain",
)


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    node: str
    log: Path
    ready_at: float = 0.0

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Fault:
    kind: str
    at: float
    pid: int | None = None
    node: str | None = None
    #: Instances whose lease the faulted worker held when the fault landed.
    affected: list[str] = field(default_factory=list)
    #: For server restarts: when the server was back.
    until: float | None = None
    #: The instance parked at the point the fault was aimed at, if any.
    parked: dict[str, Any] | None = None


@dataclass
class RigConfig:
    arm: str
    flows: int = 500
    workers: int = 3
    ttl: float = 3.0
    scan: float = 1.0
    faults: int = 3
    rate: float = 200.0
    work_ms: tuple[int, int] = (20, 80)
    redis_leases: bool = False
    drain_timeout: float = 10.0
    #: How long a restarted server stays down; ``None``: a second for PostgreSQL, and a whole
    #: TTL for Redis (so every lease runs out and is taken again from a Redis that forgot).
    outage: float | None = None
    settle_timeout: float = 300.0


class Rig:
    """One arm, end to end. ``await Rig(config, run_dir).run()`` returns its result row."""

    def __init__(self, config: RigConfig, run_dir: Path) -> None:
        self.c = config
        self.dir = run_dir
        tag = uuid.uuid4().hex[:10]
        self.schema = f"flowx_chaos_{tag}"
        self.ledger_schema = f"chaos_ledger_{tag}"
        self.prefix = f"flowx-chaos-{tag}"
        self.workers: list[Worker] = []
        self.gone: list[Worker] = []
        self.faults: list[Fault] = []
        self.started: list[str] = []
        self.exit_codes: dict[int, int | None] = {}
        self._seq = 0
        self.slowest: list[tuple[float, str, str]] = []
        self.interrupted: list[float] = []
        self._rng = random.Random()
        #: Per resume: (fault index, instance, first commit elsewhere, interrupting fault index).
        self.resumes: list[tuple[int, str, float, int | None]] = []
        self.servers = RigServers(redis=config.redis_leases)

    @property
    def dsn(self) -> str:
        return self.servers.dsn

    async def trace(self) -> dict[str, Any]:
        """The run's fault log, for analysis after the fact (not part of the result row): every
        worker, every fault with the instances it hit, every resume, and the step commits and
        effects of every instance a fault hit."""
        hit = sorted({i for f in self.faults for i in f.affected})
        commits = await self.sql(
            "SELECT s.instance_id::text, s.step_id, extract(epoch FROM s.committed_at)::float8, "
            "l.pid FROM flow_step s JOIN ledger l ON l.effect_id::text = (s.result::json #>> '{}') "
            "WHERE s.instance_id = ANY(%s::uuid[]) ORDER BY 1, 3",
            hit,
        )
        effects = await self.sql(
            "SELECT instance_id::text, step_id, extract(epoch FROM at)::float8, pid FROM ledger "
            "WHERE instance_id = ANY(%s::uuid[]) ORDER BY 1, 3",
            hit,
        )
        return {
            "config": {k: v for k, v in vars(self.c).items()},
            "workers": [
                {"pid": w.pid, "node": w.node, "ready_at": w.ready_at}
                for w in self.gone + self.workers
            ],
            "faults": [vars(f) for f in self.faults],
            "resumes": self.resumes,
            "commits": commits,
            "effects": effects,
        }

    # -- plumbing -------------------------------------------------------------------------

    @property
    def store_url(self) -> str:
        return f"{self.dsn}?flowx_schema={self.schema}"

    @property
    def leases_url(self) -> str | None:
        if not self.c.redis_leases:
            return None
        return f"{self.servers.redis_url}?flowx_prefix={self.prefix}"

    def _sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        for attempt in range(100):
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"SET search_path = {self.schema}, {self.ledger_schema}")
                    cur = conn.execute(query, args or None)  # type: ignore[arg-type]
                    return cur.fetchall() if cur.description else []
            except psycopg.OperationalError:
                if attempt == 99:
                    raise
                time.sleep(0.2)
        raise AssertionError("unreachable")

    async def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        return await asyncio.to_thread(self._sql, query, *args)

    def _prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.servers.start()
        self.servers.check_can_restart(self.c.arm)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {self.ledger_schema}")
            conn.execute(
                f"CREATE TABLE {self.ledger_schema}.ledger (effect_id uuid PRIMARY KEY, "
                "instance_id uuid NOT NULL, step_id int NOT NULL, pid int NOT NULL, "
                "at timestamptz NOT NULL DEFAULT clock_timestamp())"
            )

    def cleanup(self) -> None:
        if self.servers.pg is None:  # a server not ours: leave it as it was
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
                conn.execute(f"DROP SCHEMA IF EXISTS {self.ledger_schema} CASCADE")
        self.servers.close()

    def spawn(self) -> Worker:
        self._seq += 1
        node = f"chaos-{self._seq}"
        ready = self.dir / f"ready-{node}"
        log = self.dir / f"worker-{node}.log"
        ledger_dsn = f"{self.dsn}?options=-csearch_path%3D{self.ledger_schema}"
        env = {
            **os.environ,
            "CHAOS_DIR": str(self.dir),
            "CHAOS_LEDGER_DSN": ledger_dsn,
            "CHAOS_WORK_MS": f"{self.c.work_ms[0]},{self.c.work_ms[1]}",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        args = [
            sys.executable, "-m", "flowx.cli.main", "worker",
            "--db", self.store_url,
            "--flows", "benchmarks.rig.flows:FLOWS",
            "--node-id", node,
            "--ready-file", str(ready),
            "--lease-ttl", f"{self.c.ttl}s",
            "--recovery-scan-interval", f"{self.c.scan}s",
            "--shutdown-drain-timeout", f"{self.c.drain_timeout}s",
            "--log-level", "info",
        ]  # fmt: skip
        if self.leases_url:
            args += ["--leases", self.leases_url]
        with log.open("ab") as out:
            proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"worker {node} exited ({proc.returncode}): {log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {node} not ready in 60 s: {log.read_text()}")
            time.sleep(0.02)
        worker = Worker(proc=proc, node=node, log=log, ready_at=time.time())
        self.workers.append(worker)
        return worker

    def _retire(self, worker: Worker) -> None:
        self.workers.remove(worker)
        self.gone.append(worker)

    async def held_by(self, node: str) -> list[str]:
        """Instances whose live lease ``node`` holds, read from the lease store."""
        if not self.c.redis_leases:
            rows = await self.sql(
                "SELECT instance_id::text FROM flow_lease WHERE owner_node = %s "
                "AND expires_at > now()",
                node,
            )
            return [r[0] for r in rows]
        from redis import asyncio as aioredis

        client = aioredis.Redis.from_url(self.servers.redis_url, decode_responses=True)
        try:
            now_ms = int(time.time() * 1000)
            held = []
            async for key in client.scan_iter(match=f"{self.prefix}:lease:*", count=1000):
                row = await client.hmget(key, ["owner", "expires"])
                if row[0] == node and row[1] is not None and int(row[1]) > now_ms:
                    held.append(key.rsplit(":", 1)[-1])
            return held
        finally:
            await client.aclose()

    async def arm(
        self, worker: Worker, phase: str, *, hold: float = 3600, instance: str | None = None
    ) -> None:
        path = self.dir / f"arm-{worker.pid}.json"
        path.write_text(json.dumps({"phase": phase, "hold": hold, "instance": instance}))
        os.kill(worker.pid, signal.SIGUSR1)

    async def parked(
        self, pid: int, *, timeout: float, instance: str | None = None
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        seen: set[Path] = set()
        while time.monotonic() < deadline:
            for path in sorted(self.dir.glob(f"parked-{pid}-*.json")):
                if path in seen:
                    continue
                seen.add(path)
                note: dict[str, Any] = json.loads(path.read_text())
                path.rename(path.with_suffix(".seen"))
                if instance is None or note["instance_id"] == instance:
                    return note
            await asyncio.sleep(0.02)
        raise TimeoutError(f"no step parked on pid {pid} within {timeout:.0f}s")

    # -- the run --------------------------------------------------------------------------

    async def feed(self, host: flowx.FlowHost) -> None:
        interval = 1.0 / self.c.rate
        t0 = time.monotonic()
        for i in range(self.c.flows):
            delay = t0 + i * interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            while True:
                try:
                    # Keyed: a start retried after an unknown outcome starts nothing twice.
                    handle = await host.start(
                        order, Order(n=i), idempotency_key=f"chaos-{i}", run_here=False
                    )
                    break
                except flowx.StoreError:
                    await asyncio.sleep(0.2)  # the journal is restarting (postgres arm)
            self.started.append(handle.instance_id)

    async def settled(self) -> None:
        deadline = time.monotonic() + self.c.settle_timeout
        while time.monotonic() < deadline:
            rows = await self.sql(
                "SELECT count(*) FROM flow_instance WHERE state IN "
                "('Completed', 'Failed', 'CompensationFailed', 'TimedOut')"
            )
            if rows[0][0] >= len(self.started) == self.c.flows:
                return
            await asyncio.sleep(0.25)
        raise TimeoutError(f"instances not settled within {self.c.settle_timeout:.0f}s")

    async def run(self) -> dict[str, Any]:
        await asyncio.to_thread(self._prepare)
        wall = time.monotonic()
        try:
            for _ in range(self.c.workers):
                await asyncio.to_thread(self.spawn)
            stores = flowx.from_url(self.store_url, leases=self.leases_url)
            host = flowx.FlowHost(store=stores, flows=[order], recovery=False, node_id="controller")
            async with host:
                feeding = asyncio.ensure_future(self.feed(host))
                await self.inject()
                await feeding
                await self.settled()
            await self.stop_all()
            result = await self.check()
            result["wall_s"] = round(time.monotonic() - wall, 1)
            return result
        finally:
            for w in self.workers + self.gone:
                if w.proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(w.pid, signal.SIGCONT)
                        w.proc.kill()
                    w.proc.wait()

    async def stop_all(self) -> None:
        for w in list(self.workers):
            os.kill(w.pid, signal.SIGTERM)
        for w in list(self.workers):
            code = await asyncio.to_thread(w.proc.wait, 60)
            self.exit_codes[w.pid] = code
            self._retire(w)

    # -- faults ---------------------------------------------------------------------------

    async def _warm(self) -> None:
        """Wait until the workers are busy: a fault should land on work in flight."""
        while len(self.started) < min(self.c.flows // 5, 100):
            await asyncio.sleep(0.05)

    def _pick(self) -> Worker:
        return self._rng.choice(self.workers)

    async def _pick_busy(self) -> Worker:
        """A worker holding leases right now, so an armed step will come soon."""
        for _ in range(200):
            busy = [w for w in self.workers if await self.held_by(w.node)]
            if busy:
                return self._rng.choice(busy)
            await asyncio.sleep(0.05)
        return self._pick()

    async def _kill(
        self, worker: Worker, kind: str, parked: dict[str, Any] | None, *, replace: bool = True
    ) -> Fault:
        affected = await self.held_by(worker.node)
        fault = Fault(kind=kind, at=time.time(), pid=worker.pid, node=worker.node,
                      affected=affected, parked=parked)  # fmt: skip
        os.kill(worker.pid, signal.SIGKILL)
        await asyncio.to_thread(worker.proc.wait)
        self.faults.append(fault)
        self._retire(worker)
        if replace:
            await asyncio.to_thread(self.spawn)
        return fault

    async def inject(self) -> None:
        await self._warm()
        arms: dict[str, Callable[[], Awaitable[None]]] = {
            "kill_after_effect": lambda: self._kills("after_effect"),
            "kill_after_commit": lambda: self._kills("before_effect"),
            "zombie": self._zombie,
            "kill_during_takeover": self._takeover,
            "postgres_restart": self._postgres,
            "redis_restart": self._redis,
            "sigterm_drain": self._sigterm,
        }
        await arms[self.c.arm]()

    def _spacing(self) -> float:
        """Spread the faults over the feed, so each lands on a busy fleet."""
        feed_s = self.c.flows / self.c.rate
        # What a fault costs of its own: parking and a replacement starting (2.5 s), or a
        # stop past the TTL and a takeover, or an outage.
        cost = 2.5
        if self.c.arm in ("zombie", "kill_during_takeover"):
            cost = self.c.ttl * 2.5 + 2.5
        elif self.c.arm in ("postgres_restart", "redis_restart"):
            cost = (self.c.outage or self.c.ttl) + 3.0
        return max(0.2, feed_s / max(1, self.c.faults) - cost)

    async def _armed(self, phase: str, *, hold: float = 3600) -> tuple[Worker, dict[str, Any]]:
        """Arm a busy worker and wait for it to park; another if it ran out of work first."""
        for _ in range(5):
            worker = await self._pick_busy()
            await self.arm(worker, phase, hold=hold)
            with contextlib.suppress(TimeoutError):
                return worker, await self.parked(worker.pid, timeout=10)
            (self.dir / f"arm-{worker.pid}.json").write_text("{}")  # disarm it
            os.kill(worker.pid, signal.SIGUSR1)
        raise TimeoutError("no worker parked an armed step: is the feed still running?")

    async def _kills(self, phase: str) -> None:
        for _ in range(self.c.faults):
            worker, note = await self._armed(phase)
            await self._kill(worker, f"kill_{phase}", note)
            await asyncio.sleep(self._spacing())

    async def _zombie(self) -> None:
        for _ in range(self.c.faults):
            # Parked after its effect for one second of *its* time: it will try to commit the
            # moment it is let go, long after its lease ran out and a peer took over.
            worker, note = await self._armed("after_effect", hold=1.0)
            affected = await self.held_by(worker.node)
            fault = Fault(kind="sigstop", at=time.time(), pid=worker.pid, node=worker.node,
                          affected=affected, parked=note)  # fmt: skip
            os.kill(worker.pid, signal.SIGSTOP)
            self.faults.append(fault)
            # Stopped past its TTL until a peer has committed on the parked instance.
            await asyncio.sleep(self.c.ttl * 1.2)
            deadline = time.monotonic() + self.c.ttl * 10 + 30
            while time.monotonic() < deadline:
                rows = await self.sql(
                    "SELECT count(*) FROM flow_step s JOIN ledger l ON "
                    "l.effect_id::text = (s.result::json #>> '{}') "
                    "WHERE s.instance_id = %s AND l.pid <> %s",
                    note["instance_id"],
                    worker.pid,
                )
                if rows[0][0] > 0:
                    break
                await asyncio.sleep(0.1)
            os.kill(worker.pid, signal.SIGCONT)
            fault.until = time.time()
            await asyncio.sleep(self._spacing())

    async def _takeover(self) -> None:
        for _ in range(self.c.faults):
            first, note = await self._armed("after_effect")
            iid = note["instance_id"]
            others = [w for w in self.workers if w is not first]
            for w in others:  # whoever takes the instance over parks on it again
                await self.arm(w, "after_effect", instance=iid)
            # No replacement yet: an unarmed newcomer could take the instance over unseen.
            await self._kill(first, "kill", note, replace=False)
            deadline = time.monotonic() + self.c.ttl * 4 + self.c.scan * 4 + 30
            second = None
            while second is None and time.monotonic() < deadline:
                for w in others:
                    with contextlib.suppress(TimeoutError):
                        again = await self.parked(w.pid, timeout=0.05, instance=iid)
                        second = (w, again)
                        break
            if second is None:
                raise TimeoutError(f"nobody took {iid} over after the first kill")
            for w in self.workers:  # disarm the rest
                if w is not second[0]:
                    (self.dir / f"arm-{w.pid}.json").write_text("{}")
                    os.kill(w.pid, signal.SIGUSR1)
            await self._kill(second[0], "kill_during_takeover", second[1])
            await asyncio.to_thread(self.spawn)  # the first one's replacement
            await asyncio.sleep(self._spacing())

    async def _postgres(self) -> None:
        for _ in range(self.c.faults):
            fault = Fault(kind="postgres_restart", at=time.time())
            self.faults.append(fault)
            await asyncio.to_thread(self.servers.stop_postgres)
            await asyncio.sleep(self.c.outage if self.c.outage is not None else 1.0)
            await asyncio.to_thread(self.servers.start_postgres)
            fault.until = time.time()
            await asyncio.sleep(self._spacing())

    async def _redis(self) -> None:
        for _ in range(self.c.faults):
            fault = Fault(kind="redis_restart", at=time.time())
            self.faults.append(fault)
            await asyncio.to_thread(self.servers.stop_redis)
            await asyncio.sleep(self.c.outage if self.c.outage is not None else self.c.ttl)
            await asyncio.to_thread(self.servers.start_redis)
            fault.until = time.time()
            await asyncio.sleep(self._spacing())

    async def _sigterm(self) -> None:
        for _ in range(self.c.faults):
            worker = await self._pick_busy()
            affected = await self.held_by(worker.node)
            fault = Fault(kind="sigterm", at=time.time(), pid=worker.pid, node=worker.node,
                          affected=affected)  # fmt: skip
            os.kill(worker.pid, signal.SIGTERM)
            self.faults.append(fault)
            self.exit_codes[worker.pid] = await asyncio.to_thread(worker.proc.wait, 60)
            fault.until = time.time()
            self._retire(worker)
            await asyncio.to_thread(self.spawn)
            await asyncio.sleep(self._spacing())

    # -- invariants -----------------------------------------------------------------------

    async def check(self) -> dict[str, Any]:
        c = self.c
        n = len(self.started)
        states = dict(await self.sql("SELECT state, count(*) FROM flow_instance GROUP BY state"))
        lost = n - int(states.get("Completed", 0))
        rows = await self.sql(
            "SELECT count(*) FILTER (WHERE outcome = 'Success'), "
            "count(*) FILTER (WHERE outcome <> 'Success') FROM flow_step"
        )
        success_rows, other_rows = rows[0]
        twice = (await self.sql(
            "SELECT count(*) FROM (SELECT 1 FROM flow_step WHERE outcome = 'Success' "
            "GROUP BY instance_id, scope, step_id HAVING count(*) <> 1) x"
        ))[0][0]  # fmt: skip
        effects = (await self.sql("SELECT count(*) FROM ledger"))[0][0]
        # A committed row whose effect is not in the ledger: the journal invented an effect.
        unbacked = (await self.sql(
            "SELECT count(*) FROM flow_step s LEFT JOIN ledger l "
            "ON l.effect_id::text = (s.result::json #>> '{}') WHERE l.effect_id IS NULL"
        ))[0][0]  # fmt: skip
        orphans = await self.sql(
            "SELECT l.instance_id::text, l.step_id, l.pid, extract(epoch FROM l.at)::float8 "
            "FROM ledger l WHERE NOT EXISTS (SELECT 1 FROM flow_step s "
            "WHERE (s.result::json #>> '{}') = l.effect_id::text)"
        )
        stats = (await self.sql(
            "SELECT n_tup_upd, n_tup_del FROM pg_stat_user_tables "
            "WHERE schemaname = %s AND relname = 'flow_step'", self.schema
        ))  # fmt: skip
        updated = sum(int(x) for x in stats[0]) if stats else None
        # Ownership never goes back: per instance, a pid's committed rows are one run.
        returns = (await self.sql(
            "WITH r AS (SELECT s.instance_id, s.sequence, l.pid FROM flow_step s JOIN ledger l "
            "ON l.effect_id::text = (s.result::json #>> '{}')), "
            "b AS (SELECT instance_id, pid, CASE WHEN pid IS DISTINCT FROM lag(pid) OVER "
            "(PARTITION BY instance_id ORDER BY sequence) THEN 1 ELSE 0 END AS starts FROM r) "
            "SELECT count(*) FROM (SELECT 1 FROM b GROUP BY instance_id, pid "
            "HAVING sum(starts) > 1) x"
        ))[0][0]  # fmt: skip
        # Work the zombie did before it was stopped, committed after: a write past its lease.
        # (Once let go it may legitimately take an instance again, under a new lease: those
        # effects come after the SIGCONT and are not counted.)
        zombie_writes = 0
        for f in self.faults:
            if f.kind == "sigstop" and f.affected:
                zombie_writes += (await self.sql(
                    "SELECT count(*) FROM flow_step s JOIN ledger l "
                    "ON l.effect_id::text = (s.result::json #>> '{}') "
                    "WHERE l.pid = %s AND s.instance_id = ANY(%s::uuid[]) "
                    "AND s.committed_at > to_timestamp(%s) AND l.at < to_timestamp(%s)",
                    f.pid, f.affected, f.at, f.until,
                ))[0][0]  # fmt: skip
        faulted = {f.pid for f in self.faults if f.pid is not None and f.kind != "sigterm"}
        windows = [(f.at - 1.0, (f.until or f.at) + 2 * c.ttl + 2.0) for f in self.faults
                   if f.kind in ("postgres_restart", "redis_restart")]  # fmt: skip
        explained = 0
        unexplained: list[tuple[Any, ...]] = []
        for o in orphans:
            if o[2] in faulted or any(lo <= o[3] <= hi for lo, hi in windows):
                explained += 1
            else:
                unexplained.append(o)
        # The kill aimed between effect and commit must have left its effect uncommitted; the
        # one aimed just after a commit must have left the parked instance with no orphan.
        aimed_missed = 0
        for f in self.faults:
            if f.parked is None:
                continue
            hit = any(o[0] == f.parked["instance_id"] and o[1] == f.parked["step_id"]
                      and o[2] == f.pid for o in orphans)  # fmt: skip
            if f.parked["phase"] == "after_effect" and not hit:
                aimed_missed += 1
            if f.parked["phase"] == "before_effect" and any(
                o[0] == f.parked["instance_id"] for o in orphans
            ):
                aimed_missed += 1
        refused = sum(
            w.log.read_text(errors="replace").count("aborting without compensation")
            for w in self.gone
        )
        latencies = await self._resume_latencies()
        below_fence = await self._tokens_below_fence() if c.redis_leases else None
        drained_ok = all(code == 0 for code in self.exit_codes.values())
        result: dict[str, Any] = {
            "arm": c.arm,
            "flows": n,
            "workers": c.workers,
            "lease_ttl_s": c.ttl,
            "scan_interval_s": c.scan,
            "lease_store": "redis" if c.redis_leases else "postgresql",
            "faults": len(self.faults),
            "lost": lost,
            "states": states,
            "step_rows": success_rows,
            "expected_step_rows": n * STEPS,
            "non_success_rows": other_rows,
            "steps_committed_twice": twice,
            "effects": effects,
            "duplicate_effects": effects - success_rows,
            "uncommitted_effects": len(orphans),
            "uncommitted_effects_explained": explained,
            "uncommitted_effects_unexplained": len(unexplained),
            "aimed_faults_missed": aimed_missed,
            "committed_rows_without_effect": unbacked,
            "step_rows_updated_or_deleted": updated,
            "ownership_returns": returns,
            "zombie_writes_after_stop": zombie_writes,
            "writes_refused": refused,
            "exit_codes_zero": drained_ok,
            "resumed": len(latencies),
            "resume_p50_s": _pct(latencies, 50),
            "resume_p99_s": _pct(latencies, 99),
            "resume_max_s": round(max(latencies), 2) if latencies else None,
            "resume_slowest": self.slowest[:3],
            "resumes_interrupted_by_a_later_fault": len(self.interrupted),
            "resume_p99_with_interrupted_s": _pct(latencies + self.interrupted, 99),
            "lease_tokens_below_journal_fence": below_fence,
        }
        return result

    async def _tokens_below_fence(self) -> int:
        """Instances whose Redis lease token is below the fence their journal row holds: a
        lease store that forgot its counters and was not lifted above the journal again."""
        from redis import asyncio as aioredis

        fences = dict(await self.sql("SELECT instance_id::text, fence FROM flow_instance"))
        client = aioredis.Redis.from_url(self.servers.redis_url, decode_responses=True)
        try:
            below = 0
            for iid, fence in fences.items():
                token = await client.hget(f"{self.prefix}:lease:{iid}", "token")
                if token is not None and int(token) < int(fence):
                    below += 1
            return below
        finally:
            await client.aclose()

    async def _resume_latencies(self) -> list[float]:
        """Per affected instance: from the fault to its next commit by another process."""
        out: list[float] = []
        for fi, f in enumerate(self.faults):
            if not f.affected:
                continue
            rows = await self.sql(
                "SELECT s.instance_id, extract(epoch FROM min(s.committed_at))::float8 "
                "FROM flow_step s JOIN ledger l ON l.effect_id::text = (s.result::json #>> '{}') "
                "WHERE s.instance_id = ANY(%s::uuid[]) AND l.pid <> %s "
                "AND s.committed_at > to_timestamp(%s) GROUP BY s.instance_id",
                f.affected,
                f.pid,
                f.at,
            )
            for iid, t in rows:
                # Taken over, then killed again before its new owner committed: that wait
                # belongs to the later fault, which measures it from its own moment.
                later = [
                    gi for gi, g in enumerate(self.faults)
                    if g is not f and f.at < g.at < t and str(iid) in g.affected
                ]  # fmt: skip
                self.resumes.append((fi, str(iid), t, later[0] if later else None))
                if later:
                    self.interrupted.append(max(0.0, t - f.at))
                    continue
                out.append(max(0.0, t - f.at))
                self.slowest.append((round(t - f.at, 2), str(iid), f.kind))
        self.slowest.sort(reverse=True)
        return out


def _pct(values: list[float], p: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 2)
    return round(statistics.quantiles(values, n=100, method="inclusive")[p - 1], 2)


def invariants(result: dict[str, Any]) -> dict[str, bool]:
    """What must hold in every arm (issue 4, R3.5, R4.3, R2.2, R7.2)."""
    checks = {
        "no instance lost": result["lost"] == 0,
        "every step committed exactly once": result["step_rows"] == result["expected_step_rows"]
        and result["steps_committed_twice"] == 0
        and result["non_success_rows"] == 0,
        "every committed row has its effect": result["committed_rows_without_effect"] == 0,
        "duplicates are exactly the effects a fault cut off from their commit": (
            result["duplicate_effects"] == result["uncommitted_effects"]
            and result["uncommitted_effects_unexplained"] == 0
        ),
        "each aimed fault landed where it was aimed": result["aimed_faults_missed"] == 0,
        "no step row updated or deleted": result["step_rows_updated_or_deleted"] == 0,
        "no write past a fence (zombie)": result["zombie_writes_after_stop"] == 0,
        "workers drained and exited 0": result["exit_codes_zero"],
    }
    if result["arm"] not in ("postgres_restart", "redis_restart"):
        checks["ownership never goes back"] = result["ownership_returns"] == 0
    if result["arm"] == "redis_restart":
        checks["no lease token below a journal fence after Redis forgot"] = (
            result["lease_tokens_below_journal_fence"] == 0
        )
    if result["arm"] == "zombie":
        checks["the zombie's commits were refused"] = result["writes_refused"] >= result["faults"]
    if result["arm"] == "kill_after_commit":
        checks["no duplicate when killed just after a commit (aimed)"] = (
            result["aimed_faults_missed"] == 0
        )
    if result["arm"] == "sigterm_drain":
        checks["a drained worker leaves nothing to re-execute"] = result["uncommitted_effects"] == 0
        # R7.2: released and handed back, so a peer resumes without waiting out the lease.
        checks["peers resume a drained worker's instances within one TTL"] = (
            result["resume_max_s"] is not None and result["resume_max_s"] < result["lease_ttl_s"]
        )
    return checks


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
