"""`flowx worker` as an operator meets it: ready only once its journal answers, a wrong
database named as such instead of retried for ever, and one JSON line with fields for an
instance that ended badly."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from tests.cli.runner import invoke
from tests.cli.test_cli import ROOT
from tests.postgres_support import PG_DSN

FLOWS = "tests.cli.wait_flows:FLOWS"


def _worker(db: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.Popen(
        [
            sys.executable, "-m", "flowx.cli.main", "worker", "--db", db, "--flows", FLOWS,
            "--log-format", "json", "--shutdown-drain-timeout", "5s", *extra,
        ],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _lines(proc: subprocess.Popen[str]) -> list[dict[str, object]]:
    _, err = proc.communicate(timeout=30)
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


@pytest.mark.timeout(60)
def test_a_worker_is_ready_only_once_its_journal_answers(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    # Nothing listens on port 1: the journal is down for the whole life of this worker.
    proc = _worker("postgresql://postgres@127.0.0.1:1/test", "--ready-file", str(ready))
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the worker says it is waiting: a signal, not a sleep
            if "waiting for the journal before it is ready" in line:
                break
        assert not ready.exists()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert not ready.exists()


@pytest.mark.timeout(60)
def test_a_database_that_does_not_exist_stops_the_worker_with_a_configuration_error() -> None:
    base = PG_DSN.rsplit("/", 1)[0]
    proc = _worker(f"{base}/no_such_database_here")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    [final] = [line for line in err.splitlines() if line.startswith("error: ")]
    assert 'refused the connection: database "no_such_database_here" does not exist' in final
    assert "retrying will not help" in final
    assert "reconnecting" not in err


@pytest.mark.timeout(60)
def test_an_instance_that_ends_badly_logs_one_json_line_with_its_facts(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = tmp_path / "faults"
    faults.mkdir()
    (faults / "capture").touch()  # capture fails, then the reservation is released
    monkeypatch.setenv("FLOWX_CLI_FAULTS", str(faults))
    code, out, err = invoke(
        "start", "cli.saga", "--db", db, "--flows", FLOWS, "--input", '{"order_id": "o1"}',
        "-o", "json",
    )  # fmt: skip
    assert code == 0, err
    iid = json.loads(out)["instance_id"]
    ready = tmp_path / "ready"
    proc = _worker(db, "--ready-file", str(ready), "--recovery-scan-interval", "1s")
    try:
        code, out, err = invoke("result", iid, "--db", db, "--wait", "30", "-o", "json")
        assert code == 1, err  # it failed, as the fault made it
        assert json.loads(out)["state"] == "Failed"
        proc.send_signal(signal.SIGTERM)
        lines = _lines(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    ended = [line for line in lines if line.get("instance") == iid and "outcome" in line]
    assert len(ended) == 1, lines
    [line] = ended
    assert (line["flow"], line["version"], line["outcome"], line["step"]) == (
        "cli.saga",
        "1.0.0",
        "failed",
        "cli.capture",
    )
    assert line["level"] == "WARNING"
    assert datetime.fromisoformat(str(line["ts"])).utcoffset() is not None
    assert not ready.exists()  # removed when the worker drained


@pytest.mark.timeout(60)
async def test_a_worker_serves_metrics_over_http_while_it_runs(db: str, tmp_path: Path) -> None:
    """``flowx worker --metrics-port``: scraped over HTTP, the families an operator alerts on
    are there; the endpoint closes when the worker drains."""
    import socket
    import urllib.request

    from tests.support.polling import until

    with socket.socket() as probe:  # a port free now, for the worker to bind
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, _, err = await asyncio.to_thread(  # in-process, but its own event loop
        invoke, "start", "cli.mail", "--db", db, "--flows", FLOWS,
        "--input", '{"order_id": "m1"}',
    )  # fmt: skip
    assert code == 0, err
    ready = tmp_path / "ready"
    proc = _worker(
        db, "--ready-file", str(ready), "--metrics-port", str(port), "--metrics-interval", "0.2s"
    )

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            return str(answer.read().decode())

    try:
        await until(ready.exists, within=20, what="the worker ready")

        async def ended() -> bool:
            text = await asyncio.to_thread(scrape)
            return 'flowx_flows_ended_total{flow="cli.mail",outcome="completed"} 1.0' in text

        await until(ended, within=20, what="the mail flow counted as completed")
        samples = {
            line.split(" ")[0]
            for line in (await asyncio.to_thread(scrape)).splitlines()
            if line and not line.startswith("#")
        }  # series with a value, not just the families' HELP lines
        node = next(s for s in samples if s.startswith("flowx_journal_up{"))
        assert node.startswith('flowx_journal_up{node="')
        for series in (
            'flowx_step_commits_total{flow="cli.mail",outcome="Success"}',
            'flowx_step_commit_seconds_bucket{flow="cli.mail",le="+Inf"}',
            "flowx_outbox_pending",
            "flowx_outbox_lag_seconds",
            "flowx_outbox_dead_letters",
            "flowx_recovery_sweeps_total",
            node.replace("flowx_journal_up", "flowx_instances_in_flight"),
            node.replace("flowx_journal_up", "flowx_leases_held"),
        ):
            assert series in samples, series
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    with pytest.raises(OSError):
        scrape()
