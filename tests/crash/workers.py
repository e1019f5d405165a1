"""Real ``flowx worker`` processes for the crash tests: started, and read when they fail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_worker(
    db: str, crash_dir: Path, flows: str, *, extra_args: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """A worker with a 2 s lease TTL and fast scans, so a takeover happens within seconds."""
    env = {
        **os.environ,
        "CRASH_DIR": str(crash_dir),
        "FLOWX_LEASE_TTL": "2s",
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
            "warning",
            *extra_args,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
