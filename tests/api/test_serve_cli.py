"""``flowx serve`` as an operator runs it: a real process, real HTTP, SIGTERM to stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.polling import until_sync

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "serve-cli-admin-token-0001"
READ = "serve-cli-read-token-00001"


def _serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "flowx.cli.main", "serve",
        "--db", f"sqlite:///{tmp_path / 'journal.db'}",
        "--flows", "tests.api.api_flows:FLOWS",
        "--port", "0", "--ready-file", str(tmp_path / "ready"),
        *args,
    ]  # fmt: skip
    given = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen(
        command, cwd=ROOT, env=given, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    env = {"FLOWX_API_TOKEN": TOKEN, "FLOWX_API_READ_TOKEN": READ}
    proc = _serve(tmp_path, "--work", env=env)
    ready = tmp_path / "ready"
    try:
        until_sync(lambda: ready.exists() or proc.poll() is not None, within=60, what="ready")
        assert proc.poll() is None, proc.communicate()
        yield ready.read_text(), proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_serve_with_work_runs_what_it_starts_and_stops_cleanly_on_sigterm(
    served: tuple[str, subprocess.Popen[str]], tmp_path: Path
) -> None:
    url, proc = served
    admin = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, headers=admin, timeout=30) as client:
        started = client.post("/v1/flows/api.mail/instances", json={"input": {"order_id": "S"}})
        assert started.status_code == 201, started.text
        iid = started.json()["instance_id"]
        result = client.get(f"/v1/instances/{iid}/result", params={"wait": 20})
        assert result.status_code == 200 and result.json()["state"] == "Completed", result.text
        reader = client.get("/v1/instances", headers={"Authorization": f"Bearer {READ}"})
        assert [i["instance_id"] for i in reader.json()["instances"]] == [iid]
        assert client.get("/readyz").json()["ready"] is True
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"flowx API on {url}" in out
    assert not (tmp_path / "ready").exists()  # not ready any more once stopping


def test_serve_without_work_leaves_a_start_pending_for_the_workers(tmp_path: Path) -> None:
    proc = _serve(tmp_path, env={"FLOWX_API_TOKEN": "", "FLOWX_API_READ_TOKEN": ""})
    ready = tmp_path / "ready"
    try:
        until_sync(lambda: ready.exists() or proc.poll() is not None, within=60, what="ready")
        with httpx.Client(base_url=ready.read_text(), timeout=30) as client:
            started = client.post("/v1/flows/api.mail/instances", json={"input": {"order_id": "P"}})
            assert started.status_code == 201, started.text
            iid = started.json()["instance_id"]
            waited = client.get(f"/v1/instances/{iid}/result", params={"wait": 1})
            assert waited.status_code == 202 and waited.json()["state"] == "Pending"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "asks for no token" in err  # said once, at start


def test_serve_refuses_an_address_beyond_loopback_without_a_token(tmp_path: Path) -> None:
    env = {"FLOWX_API_TOKEN": "", "FLOWX_API_READ_TOKEN": ""}
    proc = _serve(tmp_path, "--host", "0.0.0.0", env=env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "refusing to serve on 0.0.0.0 with no token" in err
    assert "Traceback" not in err


def test_a_short_token_is_refused_without_echoing_it(tmp_path: Path) -> None:
    proc = _serve(tmp_path, env={"FLOWX_API_TOKEN": "hunter2"})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "at least 16 characters" in err and "hunter2" not in err
