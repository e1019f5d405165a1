"""Restarting the real servers mid-run, with this machine's own service commands.

Both are blunt on purpose: PostgreSQL is stopped in ``immediate`` mode (no checkpoint — a
crash, as far as clients can tell) and Redis is shut down without saving (it keeps nothing on
disk here), so every counter it held is gone when it comes back.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

REDIS_START = [
    "redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379",
    "--save", "", "--appendonly", "no", "--dir", "/var/lib/redis",
    "--logfile", "/var/log/redis/ci.log",
]  # fmt: skip


def _pg_version() -> str:
    return sorted(p.name for p in Path("/etc/postgresql").iterdir())[0]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_port(port: int, *, up: bool, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while port_open(port) != up:
        if time.monotonic() > deadline:
            state = "come up" if up else "go down"
            raise RuntimeError(f"port {port} did not {state} within {timeout:.0f}s")
        time.sleep(0.05)


def pg_ctl(action: str, *extra: str) -> None:
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", _pg_version(), "main", action, *extra],
        check=True,
        capture_output=True,
        timeout=120,
    )


def stop_postgres() -> None:
    pg_ctl("stop", "-m", "immediate")
    wait_port(5432, up=False)


def start_postgres() -> None:
    pg_ctl("start")
    wait_port(5432, up=True)


def stop_redis() -> None:
    subprocess.run(
        ["redis-cli", "-p", "6379", "shutdown", "nosave"], capture_output=True, timeout=30
    )
    wait_port(6379, up=False)


def start_redis() -> None:
    subprocess.run(REDIS_START, check=True, capture_output=True, timeout=30)
    wait_port(6379, up=True)
    # Up is not yet answering: wait for PONG.
    deadline = time.monotonic() + 30
    while True:
        out = subprocess.run(["redis-cli", "-p", "6379", "ping"], capture_output=True, text=True)
        if out.stdout.strip() == "PONG":
            return
        if time.monotonic() > deadline:
            raise RuntimeError("redis answered its port but not PING within 30s")
        time.sleep(0.05)
