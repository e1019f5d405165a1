"""The faults, one function per arm: each takes the :class:`Rig` and injects ``faults`` of its
kind, spaced over the feed, logging each as a :class:`Fault` (when, which worker, which
instances it held) for the checks to read.

Issue 4's arms: kills aimed between effect and commit or just after a commit, a zombie
(SIGSTOP past its TTL), a kill during a takeover, PostgreSQL and Redis restarts, SIGTERM
drains. Issue 12's: a COMMIT whose reply never comes (item 1), workers whose wall clock is off
by TTL/2 (item 2), and Redis leases gone for 3 × TTL under long steps (item 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from tests.faults.support import executes

from benchmarks.rig.model import Fault

if TYPE_CHECKING:
    from benchmarks.rig.controller import Rig


async def kills(rig: Rig, phase: str) -> None:
    for _ in range(rig.c.faults):
        worker, note = await rig.armed(phase)
        await rig.kill(worker, f"kill_{phase}", note)
        await asyncio.sleep(rig.spacing())


async def zombie(rig: Rig) -> None:
    for _ in range(rig.c.faults):
        # Parked after its effect for one second of *its* time: it will try to commit the
        # moment it is let go, long after its lease ran out and a peer took over.
        worker, note = await rig.armed("after_effect", hold=1.0)
        affected = await rig.held_by(worker.node)
        fault = Fault(kind="sigstop", at=time.time(), pid=worker.pid, node=worker.node,
                      affected=affected, parked=note)  # fmt: skip
        os.kill(worker.pid, signal.SIGSTOP)
        rig.faults.append(fault)
        # Stopped past its TTL until a peer has committed on the parked instance.
        await asyncio.sleep(rig.c.ttl * 1.2)
        deadline = time.monotonic() + rig.c.ttl * 10 + 30
        while time.monotonic() < deadline:
            rows = await rig.sql(
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
        await asyncio.sleep(rig.spacing())


async def takeover(rig: Rig) -> None:
    for _ in range(rig.c.faults):
        first, note = await rig.armed("after_effect")
        iid = note["instance_id"]
        others = [w for w in rig.workers if w is not first]
        for w in others:  # whoever takes the instance over parks on it again
            await rig.arm(w, "after_effect", instance=iid)
        # No replacement yet: an unarmed newcomer could take the instance over unseen.
        await rig.kill(first, "kill", note, replace=False)
        deadline = time.monotonic() + rig.c.ttl * 4 + rig.c.scan * 4 + 30
        second = None
        while second is None and time.monotonic() < deadline:
            for w in others:
                with contextlib.suppress(TimeoutError):
                    again = await rig.parked(w.pid, timeout=0.05, instance=iid)
                    second = (w, again)
                    break
        if second is None:
            raise TimeoutError(f"nobody took {iid} over after the first kill")
        for w in rig.workers:  # disarm the rest
            if w is not second[0]:
                (rig.dir / f"arm-{w.pid}.json").write_text("{}")
                os.kill(w.pid, signal.SIGUSR1)
        await rig.kill(second[0], "kill_during_takeover", second[1])
        await rig.start_worker()  # the first one's replacement
        await asyncio.sleep(rig.spacing())


async def postgres(rig: Rig) -> None:
    for _ in range(rig.c.faults):
        fault = Fault(kind="postgres_restart", at=time.time())
        rig.faults.append(fault)
        await asyncio.to_thread(rig.servers.stop_postgres)
        await asyncio.sleep(rig.c.outage if rig.c.outage is not None else 1.0)
        await asyncio.to_thread(rig.servers.start_postgres)
        fault.until = time.time()
        await asyncio.sleep(rig.spacing())


async def redis(rig: Rig, kind: str = "redis_restart") -> None:
    """Redis leases: the lease store gone for a TTL (every lease runs out and is taken again
    from a Redis that forgot every counter) or, as ``lease_store_outage``, for 3 × TTL while
    steps outlast a renewal interval, so they finish with no live lease (item 3)."""
    default = rig.c.ttl * (3 if kind == "lease_store_outage" else 1)
    for _ in range(rig.c.faults):
        fault = Fault(kind=kind, at=time.time())
        rig.faults.append(fault)
        await asyncio.to_thread(rig.servers.stop_redis)
        await asyncio.sleep(rig.c.outage if rig.c.outage is not None else default)
        await asyncio.to_thread(rig.servers.start_redis)
        fault.until = time.time()
        await asyncio.sleep(rig.spacing())


async def sigterm(rig: Rig) -> None:
    for _ in range(rig.c.faults):
        worker = await rig.pick_busy()
        affected = await rig.held_by(worker.node)
        fault = Fault(kind="sigterm", at=time.time(), pid=worker.pid, node=worker.node,
                      affected=affected)  # fmt: skip
        os.kill(worker.pid, signal.SIGTERM)
        rig.faults.append(fault)
        rig.exit_codes[worker.pid] = await asyncio.to_thread(worker.proc.wait, 60)
        fault.until = time.time()
        rig.retire(worker)
        await rig.start_worker()
        await asyncio.sleep(rig.spacing())


async def commit_no_reply(rig: Rig) -> None:
    """Item 1: a worker's journal connection goes through a fault proxy. A step parks just
    after its effect; the proxy is told to swallow the reply to that step's commit, keeping
    the connection open: the server runs the COMMIT, the worker never hears back. The worker
    gives the commit up at its deadline (an unknown outcome) and settles it: it re-reads the
    instance under the lease it still holds and runs on (R9.1). Where it cannot, a peer (or
    its own sweep) takes the instance over under a new lease. Either way it completes,
    re-running nothing."""
    for _ in range(rig.c.faults):
        worker, note = await rig.armed("after_effect", hold=1.0, before_last=True)
        assert worker.proxy is not None, "commit_no_reply workers reach the journal via a proxy"
        iid = note["instance_id"]
        caught = worker.proxy.withhold_next_reply(_commit_of(iid))
        try:
            await asyncio.wait_for(caught.wait(), timeout=30)
        except TimeoutError:
            await worker.proxy.forward()
            raise TimeoutError(f"the commit of {iid} never went through the proxy") from None
        fault = Fault(kind="commit_no_reply", at=time.time(), pid=worker.pid, node=worker.node,
                      affected=[iid], parked=note)  # fmt: skip
        rig.faults.append(fault)
        await rig.until_sql(
            "SELECT count(*) FROM flow_instance WHERE instance_id = %s AND state = 'Completed'",
            iid, within=rig.c.ttl * 6 + rig.c.scan * 4 + 30,
            what=f"{iid} completed, settled by its owner or taken over",
        )  # fmt: skip
        await worker.proxy.forward()  # the late reply reaches a connection long given up
        fault.until = time.time()
        await asyncio.sleep(rig.spacing())


def _commit_of(instance_id: str) -> Callable[[bytes], bool]:
    """A request that executes a step commit of ``instance_id``: only a commit carries the
    capability's id; renewals carry ids alone. The id goes as text, or as 16 bytes."""
    text, raw = instance_id.encode(), uuid.UUID(instance_id).bytes

    def matches(chunk: bytes) -> bool:
        return executes(chunk) and b"chaos.effect" in chunk and (text in chunk or raw in chunk)

    return matches


async def clock_skew(rig: Rig) -> None:
    """Item 2: the workers run with wall clocks ``RigConfig.skews`` off (libfaketime), for
    the whole run. Leases are judged on the journal's clock, so no lease is taken from a
    live owner (the checks count ownership changes with no fault behind them) and every
    worker gets its share of the work. The faults: kills aimed between effect and commit on
    the skewed workers only, each replaced by a worker with the same skew, so recovery of a
    skewed node's work is measured too (about TTL + scan, not TTL + skew)."""
    for _ in range(rig.c.faults):
        try:
            worker, note = await rig.armed("after_effect", skewed=True)
        except TimeoutError:
            # Neither skewed worker ran a step for a while (the feed is over, or they were
            # idle between intake batches): the row shows how many faults were injected.
            break
        await rig.kill(worker, "kill_skewed", note)
        await asyncio.sleep(rig.spacing())
