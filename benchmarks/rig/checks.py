"""What a chaos arm measures and what must hold, read in SQL once every instance has settled
(issue 4, issue 12; R2.2, R2.4, R3.5, R4.3, R7.2).

Separate from the controller so the rules are read in one place: the controller only injects
faults and keeps a log of them (which worker, when, which instances it held).
"""

from __future__ import annotations

import re
import statistics
from typing import TYPE_CHECKING, Any

from benchmarks.rig.flows import STEPS

if TYPE_CHECKING:
    from benchmarks.rig.controller import Rig

#: Faults that take a server away from every worker at once.
SERVER_OUTAGES = ("postgres_restart", "redis_restart", "lease_store_outage")


async def check(rig: Rig) -> dict[str, Any]:
    c = rig.c
    n = len(rig.started)
    states = dict(await rig.sql("SELECT state, count(*) FROM flow_instance GROUP BY state"))
    lost = n - int(states.get("Completed", 0))
    rows = await rig.sql(
        "SELECT count(*) FILTER (WHERE outcome = 'Success'), "
        "count(*) FILTER (WHERE outcome <> 'Success') FROM flow_step"
    )
    success_rows, other_rows = rows[0]
    twice = (await rig.sql(
        "SELECT count(*) FROM (SELECT 1 FROM flow_step WHERE outcome = 'Success' "
        "GROUP BY instance_id, scope, step_id HAVING count(*) <> 1) x"
    ))[0][0]  # fmt: skip
    effects = (await rig.sql("SELECT count(*) FROM ledger"))[0][0]
    # A committed row whose effect is not in the ledger: the journal invented an effect.
    unbacked = (await rig.sql(
        "SELECT count(*) FROM flow_step s LEFT JOIN ledger l "
        "ON l.effect_id::text = (s.result::json #>> '{}') WHERE l.effect_id IS NULL"
    ))[0][0]  # fmt: skip
    orphans = await rig.sql(
        "SELECT l.instance_id::text, l.step_id, l.pid, extract(epoch FROM l.at)::float8 "
        "FROM ledger l WHERE NOT EXISTS (SELECT 1 FROM flow_step s "
        "WHERE (s.result::json #>> '{}') = l.effect_id::text)"
    )
    stats = (await rig.sql(
        "SELECT n_tup_upd, n_tup_del FROM pg_stat_user_tables "
        "WHERE schemaname = %s AND relname = 'flow_step'", rig.schema
    ))  # fmt: skip
    updated = sum(int(x) for x in stats[0]) if stats else None
    # Ownership never goes back: per instance, a pid's committed rows are one run.
    returns = (await rig.sql(
        "WITH r AS (SELECT s.instance_id, s.sequence, l.pid FROM flow_step s JOIN ledger l "
        "ON l.effect_id::text = (s.result::json #>> '{}')), "
        "b AS (SELECT instance_id, pid, CASE WHEN pid IS DISTINCT FROM lag(pid) OVER "
        "(PARTITION BY instance_id ORDER BY sequence) THEN 1 ELSE 0 END AS starts FROM r) "
        "SELECT count(*) FROM (SELECT 1 FROM b GROUP BY instance_id, pid "
        "HAVING sum(starts) > 1) x"
    ))[0][0]  # fmt: skip
    # Work the zombie did before it was stopped, committed after a peer had taken the instance
    # over (committed there since the stop): a write past the peer's fence. A finished step
    # that commits after the stop on an instance nobody took over is not one: it commits under
    # the token it ran with and the journal's fence decides (R2.4, issue 12 item 3). (Once let
    # go the zombie may take an instance again, under a new lease: those effects come after
    # the SIGCONT and are not counted.)
    zombie_writes = 0
    for f in rig.faults:
        if f.kind == "sigstop" and f.affected:
            zombie_writes += (await rig.sql(
                "WITH c AS (SELECT s.instance_id, s.committed_at, l.pid, l.at FROM flow_step s "
                "JOIN ledger l ON l.effect_id::text = (s.result::json #>> '{}') "
                "WHERE s.instance_id = ANY(%s::uuid[]) AND s.committed_at > to_timestamp(%s)) "
                "SELECT count(*) FROM c z WHERE z.pid = %s AND z.at < to_timestamp(%s) "
                "AND EXISTS (SELECT 1 FROM c p WHERE p.instance_id = z.instance_id "
                "AND p.pid <> z.pid AND p.committed_at < z.committed_at)",
                f.affected, f.at, f.pid, f.until,
            ))[0][0]  # fmt: skip
    # An effect with no commit is explained by a fault that could cut it off: its process was
    # killed; or it was stopped or lost a commit's reply, and the effect is from around then;
    # or a server was down around then.
    killed = {f.pid for f in rig.faults if f.pid is not None and f.kind.startswith("kill")}
    windows = [(f.pid, f.at - 5.0, (f.until or f.at) + 2 * c.ttl + 2.0) for f in rig.faults
               if f.kind in ("sigstop", "commit_no_reply")]  # fmt: skip
    windows += [(None, f.at - 1.0, (f.until or f.at) + 2 * c.ttl + 2.0) for f in rig.faults
                if f.kind in SERVER_OUTAGES]  # fmt: skip
    explained = 0
    unexplained: list[tuple[Any, ...]] = []
    for o in orphans:
        if o[2] in killed or any(
            pid in (None, o[2]) and lo <= o[3] <= hi for pid, lo, hi in windows
        ):
            explained += 1
        else:
            unexplained.append(o)
    # The kill aimed between effect and commit must have left its effect uncommitted; the
    # one aimed just after a commit must have left the parked instance with no orphan.
    aimed_missed = 0
    for f in rig.faults:
        if f.parked is None:
            continue
        hit = any(o[0] == f.parked["instance_id"] and o[1] == f.parked["step_id"]
                  and o[2] == f.pid for o in orphans)  # fmt: skip
        if f.kind == "commit_no_reply":
            # The swallowed COMMIT ran on the server: the parked step is committed, with the
            # faulted worker's effect, and nothing was cut off.
            landed = (await rig.sql(
                "SELECT count(*) FROM flow_step s JOIN ledger l "
                "ON l.effect_id::text = (s.result::json #>> '{}') "
                "WHERE s.instance_id = %s AND s.step_id = %s AND l.pid = %s",
                f.parked["instance_id"], f.parked["step_id"], f.pid,
            ))[0][0]  # fmt: skip
            aimed_missed += 1 if hit or landed != 1 else 0
        elif f.parked["phase"] == "after_effect" and not hit:
            aimed_missed += 1
        # Only an orphan this kill made counts: the parked instance may carry one an earlier
        # fault cut off (it was resumed, then parked on again), which that fault explains.
        if f.parked["phase"] == "before_effect" and any(
            o[0] == f.parked["instance_id"] and o[2] == f.pid for o in orphans
        ):
            aimed_missed += 1
    logs = [w.log.read_text(errors="replace") for w in rig.gone]
    refused = sum(text.count("aborting without compensation") for text in logs)
    latencies = await _resume_latencies(rig)
    below_fence = await _tokens_below_fence(rig) if c.redis_leases else None
    drained_ok = all(code == 0 for code in rig.exit_codes.values())
    result: dict[str, Any] = {
        "arm": c.arm,
        "flows": n,
        "workers": c.workers,
        "lease_ttl_s": c.ttl,
        "scan_interval_s": c.scan,
        "lease_store": "redis" if c.redis_leases else "postgresql",
        "faults": len(rig.faults),
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
        "ownership_returns_unexplained": await _returns_unexplained(rig) if returns else 0,
        "zombie_writes_after_stop": zombie_writes,
        "writes_past_a_fence": zombie_writes + await _past_the_fence(rig),
        "writes_refused": refused,
        "writes_refused_by_the_fence": sum(
            text.count("aborting without compensation: write to instance") for text in logs
        ),
        "runs_stopped_on_a_lost_lease": sum(
            text.count("aborting without compensation: lease on") for text in logs
        ),
        "exit_codes_zero": drained_ok,
        "resumed": len(latencies),
        "resume_p50_s": _pct(latencies, 50),
        "resume_p99_s": _pct(latencies, 99),
        "resume_max_s": round(max(latencies), 2) if latencies else None,
        "resume_slowest": rig.slowest[:3],
        "resumes_interrupted_by_a_later_fault": len(rig.interrupted),
        "resume_p99_with_interrupted_s": _pct(latencies + rig.interrupted, 99),
        "lease_tokens_below_journal_fence": below_fence,
        "takeovers_without_a_fault": await _takeovers_without_a_fault(rig),
    }
    if c.skews:
        result["work_share_by_skew"] = await _work_share(rig)
        # What the workers measured against the journal's clock at start: the skew was real.
        result["clock_offsets_measured_s"] = sorted({
            round(float(m[1]) * (1 if m[2] == "ahead of" else -1), 1)
            for text in logs
            for m in re.finditer(r"this node's clock is ([0-9.]+)s (ahead of|behind) ", text)
        })  # fmt: skip
    if c.arm == "lease_store_outage":
        result["uncommitted_effects_finished_in_the_outage"] = sum(
            1 for o in orphans
            if any(f.at <= o[3] <= (f.until or f.at) for f in rig.faults)
        )  # fmt: skip
    return result


async def _returns_unexplained(rig: Rig) -> int:
    """Instances whose commits go back to an earlier process although no process that owned
    it in between met a fault in between: ownership never goes back without a cause."""
    rows = await rig.sql(
        "SELECT s.instance_id::text, l.pid, extract(epoch FROM s.committed_at)::float8 "
        "FROM flow_step s JOIN ledger l ON l.effect_id::text = (s.result::json #>> '{}') "
        "ORDER BY s.instance_id, s.sequence"
    )
    faulted: dict[int, list[float]] = {}
    for f in rig.faults:
        if f.pid is not None:
            faulted.setdefault(f.pid, []).append(f.at)
    runs: dict[str, list[list[Any]]] = {}
    for iid, pid, t in rows:  # per instance, [pid, first commit, last commit] of each run
        mine = runs.setdefault(iid, [])
        if mine and mine[-1][0] == pid:
            mine[-1][2] = t
        else:
            mine.append([pid, t, t])
    bad = 0
    for mine in runs.values():
        for i, (pid, _first, last) in enumerate(mine):
            for j in range(i + 2, len(mine)):
                if mine[j][0] != pid:
                    continue
                between = mine[i + 1 : j]
                if not all(
                    any(last <= at <= mine[j][1] for at in faulted.get(m[0], ())) for m in between
                ):
                    bad += 1
    return bad


async def _past_the_fence(rig: Rig) -> int:
    """Commits by a node whose commit reply was swallowed, on the instance it lost, after a
    peer had committed there: a write past the peer's fence (R2.4)."""
    past = 0
    for f in rig.faults:
        if f.kind != "commit_no_reply":
            continue
        past += (await rig.sql(
            "WITH mine AS (SELECT s.committed_at, l.pid FROM flow_step s JOIN ledger l "
            "ON l.effect_id::text = (s.result::json #>> '{}') "
            "WHERE s.instance_id = ANY(%s::uuid[])) "
            "SELECT count(*) FROM mine WHERE pid = %s AND committed_at > (SELECT min(committed_at) "
            "FROM mine WHERE pid <> %s AND committed_at > to_timestamp(%s))",
            f.affected, f.pid, f.pid, f.at,
        ))[0][0]  # fmt: skip
    return past


async def _takeovers_without_a_fault(rig: Rig) -> int:
    """Ownership changes no fault explains: an instance's next commit by another process while
    the one before had met no fault yet — a lease taken from a live owner."""
    rows = await rig.sql(
        "WITH r AS (SELECT s.instance_id, l.pid, extract(epoch FROM s.committed_at)::float8 AS t,"
        " lag(l.pid) OVER (PARTITION BY s.instance_id ORDER BY s.sequence) AS before "
        "FROM flow_step s JOIN ledger l ON l.effect_id::text = (s.result::json #>> '{}')) "
        "SELECT before, t FROM r WHERE before IS NOT NULL AND before <> pid"
    )
    first_fault: dict[int, float] = {}
    for f in rig.faults:
        if f.pid is not None:
            first_fault[f.pid] = min(first_fault.get(f.pid, f.at), f.at)
    outages = [(f.at, (f.until or f.at) + 2 * rig.c.ttl + 2.0) for f in rig.faults
               if f.kind in SERVER_OUTAGES]  # fmt: skip
    return sum(
        1 for before, t in rows
        if first_fault.get(before, float("inf")) > t
        and not any(lo <= t <= hi for lo, hi in outages)
    )  # fmt: skip


async def _work_share(rig: Rig) -> dict[str, float]:
    """Share of the step commits made by the workers of each clock skew: no starvation."""
    skew = {w.pid: w.skew for w in rig.gone + rig.workers}
    rows = await rig.sql(
        "SELECT l.pid, count(*) FROM flow_step s JOIN ledger l "
        "ON l.effect_id::text = (s.result::json #>> '{}') GROUP BY l.pid"
    )
    total = sum(n for _, n in rows) or 1
    share: dict[str, float] = {}
    for pid, n in rows:
        key = f"{skew.get(pid, 0.0):+g}s"
        share[key] = round(share.get(key, 0.0) + n / total, 4)
    return share


async def _tokens_below_fence(rig: Rig) -> int:
    """Instances whose Redis lease token is below the fence their journal row holds: a
    lease store that forgot its counters and was not lifted above the journal again."""
    from redis import asyncio as aioredis

    fences = dict(await rig.sql("SELECT instance_id::text, fence FROM flow_instance"))
    client = aioredis.Redis.from_url(rig.servers.redis_url, decode_responses=True)
    try:
        below = 0
        for iid, fence in fences.items():
            token = await client.hget(f"{rig.prefix}:lease:{iid}", "token")
            if token is not None and int(token) < int(fence):
                below += 1
        return below
    finally:
        await client.aclose()


async def _resume_latencies(rig: Rig) -> list[float]:
    """Per affected instance: from the fault to its next commit by another process."""
    out: list[float] = []
    for fi, f in enumerate(rig.faults):
        if not f.affected:
            continue
        rows = await rig.sql(
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
                gi for gi, g in enumerate(rig.faults)
                if g is not f and f.at < g.at < t and str(iid) in g.affected
            ]  # fmt: skip
            rig.resumes.append((fi, str(iid), t, later[0] if later else None))
            if later:
                rig.interrupted.append(max(0.0, t - f.at))
                continue
            out.append(max(0.0, t - f.at))
            rig.slowest.append((round(t - f.at, 2), str(iid), f.kind))
    rig.slowest.sort(reverse=True)
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
        "no write past a fence": result.get("writes_past_a_fence", 0) == 0
        and result["zombie_writes_after_stop"] == 0,
        "workers drained and exited 0": result["exit_codes_zero"],
    }
    if result["arm"] not in SERVER_OUTAGES:
        # A zombie's instance may go back to the peer it came from: past a stopped owner.
        checks["ownership goes back only past a faulted owner"] = (
            result.get("ownership_returns_unexplained", result["ownership_returns"]) == 0
        )
    if result["arm"] in ("clock_skew", "commit_no_reply"):
        checks["no lease taken from a live owner"] = result["takeovers_without_a_fault"] == 0
    if result["arm"] == "clock_skew":
        shares = result["work_share_by_skew"].values()
        # No starvation: every clock gets at least half of an even share of the work.
        checks["no worker starved"] = min(shares) >= 0.5 / len(shares)
    if result["arm"] == "commit_no_reply":
        checks["a swallowed commit landed: nothing re-ran"] = result["uncommitted_effects"] == 0
    if result["arm"] == "lease_store_outage":
        checks["no step finished with the journal up was re-run"] = (
            result["uncommitted_effects_finished_in_the_outage"] == 0
        )
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
