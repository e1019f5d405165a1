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
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from tests.faults.skew_support import skewed_env
from tests.support.fault_proxy import FaultProxy

import flowx
from benchmarks.rig import arms, checks
from benchmarks.rig.flows import Order, order
from benchmarks.rig.model import Fault, RigConfig, Worker
from benchmarks.rig.services import RigServers

ROOT = Path(__file__).resolve().parents[2]
#: Instances kept in flight past the planned feed while faults are still to come.
TRICKLE = 20


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
        self._feed_end = 0.0
        self._rounds = 0
        self._injected = asyncio.Event()
        self._fed = False

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

    def spawn(self, skew: float = 0.0, proxy: FaultProxy | None = None) -> Worker:
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
        if skew:
            # Only the wall clock is off, as with a node whose NTP is broken; the offset check
            # at start is let through (it refuses past TTL/3, and this skew is TTL/2).
            env.update(skewed_env(skew))
            env["FLOWX_MAX_CLOCK_OFFSET"] = f"{int(self.c.ttl * 1000)}ms"
        db = self.store_url
        if proxy is not None:
            db = db.replace(f"{urlsplit(self.dsn).netloc}", f"postgres@127.0.0.1:{proxy.port}", 1)
        args = [
            sys.executable, "-m", "flowx.cli.main", "worker",
            "--db", db,
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
        worker = Worker(proc=proc, node=node, log=log, ready_at=time.time(), skew=skew)
        self.workers.append(worker)
        return worker

    async def start_worker(self, skew: float = 0.0) -> Worker:
        """A new worker, ready. In ``commit_no_reply`` its journal connections go through a
        fault proxy of its own (the ledger does not: the effect system is not the journal)."""
        proxy = None
        if self.c.arm == "commit_no_reply":
            target = urlsplit(self.dsn)
            proxy = FaultProxy(target.hostname or "127.0.0.1", target.port or 5432)
            await proxy.start()
        try:
            worker = await asyncio.to_thread(self.spawn, skew, proxy)
        except BaseException:
            if proxy is not None:
                await proxy.stop()
            raise
        worker.proxy = proxy
        return worker

    def retire(self, worker: Worker) -> None:
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
        self,
        worker: Worker,
        phase: str,
        *,
        hold: float = 3600,
        instance: str | None = None,
        before_last: bool = False,
    ) -> None:
        path = self.dir / f"arm-{worker.pid}.json"
        note = {"phase": phase, "hold": hold, "instance": instance, "before_last": before_last}
        path.write_text(json.dumps(note))
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
        """The planned flows at the planned rate; then, while faults are still to come, a
        trickle that keeps a few instances in flight. A fault is aimed at a step in flight: on
        a fast machine the planned backlog can drain before the last fault is armed, and an
        armed worker with nothing to run would wait for ever."""
        interval = 1.0 / self.c.rate
        t0 = time.monotonic()
        for i in range(self.c.flows):
            delay = t0 + i * interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._start_one(host, i)
        i = self.c.flows
        while not self._injected.is_set():
            unsettled = (await self.sql(
                "SELECT count(*) FROM flow_instance WHERE state NOT IN "
                "('Completed', 'Failed', 'CompensationFailed', 'TimedOut')"
            ))[0][0]  # fmt: skip
            for _ in range(max(0, TRICKLE - unsettled)):
                await self._start_one(host, i)
                i += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._injected.wait(), 0.1)
        self._fed = True

    async def _start_one(self, host: flowx.FlowHost, i: int) -> None:
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
            if self._fed and rows[0][0] >= len(self.started):
                return
            await asyncio.sleep(0.25)
        raise TimeoutError(f"instances not settled within {self.c.settle_timeout:.0f}s")

    async def run(self) -> dict[str, Any]:
        await asyncio.to_thread(self._prepare)
        wall = time.monotonic()
        try:
            for i in range(self.c.workers):
                skews = self.c.skews
                await self.start_worker(skews[i % len(skews)] if skews else 0.0)
            stores = flowx.from_url(self.store_url, leases=self.leases_url)
            host = flowx.FlowHost(
                store=stores,
                flows=[order],
                settings=flowx.HostSettings.load(recovery=False, node_id="controller"),
            )
            async with host:
                self._feed_end = time.monotonic() + self.c.flows / self.c.rate
                feeding = asyncio.ensure_future(self.feed(host))
                try:
                    await self.inject()
                finally:
                    self._injected.set()
                await feeding
                await self.settled()
            await self.stop_all()
            result = await checks.check(self)
            result["wall_s"] = round(time.monotonic() - wall, 1)
            return result
        finally:
            for w in self.workers + self.gone:
                if w.proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(w.pid, signal.SIGCONT)
                        w.proc.kill()
                    w.proc.wait()
                if w.proxy is not None:
                    await w.proxy.stop()

    async def stop_all(self) -> None:
        for w in list(self.workers):
            os.kill(w.pid, signal.SIGTERM)
        for w in list(self.workers):
            code = await asyncio.to_thread(w.proc.wait, 60)
            self.exit_codes[w.pid] = code
            self.retire(w)

    # -- faults ---------------------------------------------------------------------------

    async def _warm(self) -> None:
        """Wait until the workers are busy: a fault should land on work in flight."""
        while len(self.started) < min(self.c.flows // 5, 100):
            await asyncio.sleep(0.05)

    async def pick_busy(self, *, skewed: bool = False) -> Worker:
        """A worker holding leases right now, so an armed step will come soon (``skewed``:
        one whose clock is off)."""
        pool = [w for w in self.workers if w.skew or not skewed]
        for _ in range(200):
            busy = [w for w in pool if await self.held_by(w.node)]
            if busy:
                return self._rng.choice(busy)
            await asyncio.sleep(0.05)
        return self._rng.choice(pool)

    async def kill(
        self, worker: Worker, kind: str, parked: dict[str, Any] | None, *, replace: bool = True
    ) -> Fault:
        """SIGKILL, logged with the instances it held; replaced by a worker with its skew."""
        affected = await self.held_by(worker.node)
        fault = Fault(kind=kind, at=time.time(), pid=worker.pid, node=worker.node,
                      affected=affected, parked=parked)  # fmt: skip
        os.kill(worker.pid, signal.SIGKILL)
        await asyncio.to_thread(worker.proc.wait)
        self.faults.append(fault)
        self.retire(worker)
        if replace:
            await self.start_worker(worker.skew)
        return fault

    async def until_sql(self, query: str, *args: Any, within: float, what: str) -> None:
        """Wait until ``query`` (a count) is non-zero."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if (await self.sql(query, *args))[0][0]:
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"not within {within:.0f} s: {what}")

    async def taken_over(self, instance_id: str, pid: int, *, within: float) -> None:
        """Wait until a process other than ``pid`` has committed a step of the instance."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            rows = await self.sql(
                "SELECT count(*) FROM flow_step s JOIN ledger l ON "
                "l.effect_id::text = (s.result::json #>> '{}') "
                "WHERE s.instance_id = %s AND l.pid <> %s",
                instance_id,
                pid,
            )
            if rows[0][0] > 0:
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"nobody took {instance_id} over within {within:.0f} s")

    async def inject(self) -> None:
        await self._warm()
        run: dict[str, Callable[[], Awaitable[None]]] = {
            "kill_after_effect": lambda: arms.kills(self, "after_effect"),
            "kill_after_commit": lambda: arms.kills(self, "before_effect"),
            "zombie": lambda: arms.zombie(self),
            "kill_during_takeover": lambda: arms.takeover(self),
            "postgres_restart": lambda: arms.postgres(self),
            "redis_restart": lambda: arms.redis(self),
            "sigterm_drain": lambda: arms.sigterm(self),
            "commit_no_reply": lambda: arms.commit_no_reply(self),
            "clock_skew": lambda: arms.clock_skew(self),
            "lease_store_outage": lambda: arms.redis(self, "lease_store_outage"),
        }
        await run[self.c.arm]()

    def spacing(self) -> float:
        """Spread the faults over the feed, so each lands on a busy fleet: what is left of the
        feed, shared among the faults still to come. Called once after each fault; it reckons
        from the clock, so faults that took longer than planned (an armed worker that had no
        step to run for a while) do not push the last ones past the end of the feed."""
        c = self.c
        self._rounds += 1
        to_come = c.faults - self._rounds
        if to_come <= 0:
            return 0.2
        slot = (self._feed_end - time.monotonic()) / to_come
        # What a fault costs of its own: parking and a replacement starting (2.5 s), or a
        # stop past the TTL and a takeover, or an outage.
        cost = 2.5
        if c.arm in ("zombie", "kill_during_takeover"):
            cost = c.ttl * 2.5 + 2.5
        elif c.arm == "commit_no_reply":
            cost = c.ttl * 1.5 + c.scan + 2.5
        elif c.arm in ("postgres_restart", "redis_restart"):
            cost = (c.outage or c.ttl) + 3.0
        elif c.arm == "lease_store_outage":
            cost = (c.outage or c.ttl * 3) + 3.0
        return max(0.2, slot - cost)

    async def armed(
        self, phase: str, *, hold: float = 3600, skewed: bool = False, before_last: bool = False
    ) -> tuple[Worker, dict[str, Any]]:
        """Arm a busy worker and wait for it to park; another if it ran out of work first."""
        for _ in range(5):
            worker = await self.pick_busy(skewed=skewed)
            armed_at = time.time()
            await self.arm(worker, phase, hold=hold, before_last=before_last)
            with contextlib.suppress(TimeoutError):
                note = await self.parked(worker.pid, timeout=10)
                # How long the worker took to run a step after being armed: the fault log
                # shows where an aimed fault lands (benchmarks/rig/interrupts.py).
                note["armed_at"] = armed_at
                return worker, note
            (self.dir / f"arm-{worker.pid}.json").write_text("{}")  # disarm it
            os.kill(worker.pid, signal.SIGUSR1)
        raise TimeoutError("no worker parked an armed step: is the feed still running?")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
