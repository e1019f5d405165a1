"""Real ``flowx worker`` processes for the crash tests: started, and read when they fail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_worker(
    db: str,
    crash_dir: Path,
    flows: str,
    *,
    extra_args: tuple[str, ...] = (),
    lease_ttl: str = "2s",
    log_level: str = "warning",
    stderr: Path | None = None,
) -> subprocess.Popen[bytes]:
    """A worker with a 2 s lease TTL and fast scans, so a takeover happens within seconds.
    ``stderr``: a file for the worker's stderr alone (stdout is then discarded), for tests
    that read what the process printed, not what it logged to stdout."""
    env = {
        **os.environ,
        "CRASH_DIR": str(crash_dir),
        "FLOWX_LEASE_TTL": lease_ttl,
        "FLOWX_RECOVERY_SCAN_INTERVAL": "200ms",
        "FLOWX_TIMER_POLL_INTERVAL": "200ms",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowx.cli.main",
            "worker",
            "--db",
            db,
            "--flows",
            flows,
            "--log-level",
            log_level,
            *extra_args,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE if stderr is None else subprocess.DEVNULL,
        stderr=subprocess.STDOUT if stderr is None else stderr.open("wb"),
    )
