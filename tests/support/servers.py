"""Throwaway servers of a test's (or a benchmark's) own: a PostgreSQL cluster ``initdb``-ed into
a temporary directory and a ``redis-server``, each on a free loopback port.

Why: a fault test that stops or restarts a server must never touch the shared ones — other
sessions use them at the same time. A server of one's own can be stopped in ``immediate`` mode
(a crash, as clients see it) or killed, and started again on the same port.

Neither keeps anything worth keeping: the cluster runs with ``fsync`` as configured by the
caller and is deleted by :meth:`ThrowawayPostgres.destroy`; Redis has no persistence, so a
restarted one comes back empty, as a cache without disk does.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin"))


class ServerUnavailable(RuntimeError):
    """The machine cannot run a throwaway server (no binaries, not root): tests skip on it."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _as_postgres(*command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", "postgres", "--", *command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )


class ThrowawayPostgres:
    """A PostgreSQL cluster in a temporary directory, owned by ``postgres``, on a free port.

    ``start()`` initialises it the first time; ``stop()`` keeps its data, so ``start()`` again
    is a restart on the same port. ``destroy()`` stops it and deletes everything.
    """

    def __init__(self, prefix: str = "flowx-pg-", settings: dict[str, str] | None = None) -> None:
        if not PG_BIN:
            raise ServerUnavailable("no PostgreSQL server binaries under /usr/lib/postgresql")
        if os.geteuid() != 0:
            raise ServerUnavailable("a throwaway cluster is run as the postgres user (runuser)")
        self.bin = PG_BIN[-1]
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self.port = free_port()
        self.log = self.dir / "server.log"
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "shared_buffers": "32MB",
            "max_connections": "200",
            **(settings or {}),
        }

    def init(self) -> None:
        """``initdb`` the cluster if it is not there yet; a caller may then change its files
        (``pg_hba.conf``, certificates) before ``start()``."""
        if not self.data.exists():
            _as_postgres(
                str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                "-E", "UTF8", "--no-sync",
            )  # fmt: skip

    def start(self) -> None:
        self.init()
        options = f"-p {self.port} -k {self.dir} " + " ".join(
            f"-c {k}={v}" for k, v in self.settings.items()
        )
        _as_postgres(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
            "-w", "-t", "60", "-o", options, "start",
        )  # fmt: skip

    @property
    def postmaster(self) -> int:
        return int((self.data / "postmaster.pid").read_text().splitlines()[0])

    def processes(self) -> list[int]:
        """The postmaster and every process it has forked."""
        pm = self.postmaster
        children = Path(f"/proc/{pm}/task/{pm}/children").read_text().split()
        return [pm, *(int(c) for c in children)]

    def stop(self) -> None:
        """``immediate``: no checkpoint, every backend gone at once — a crash to its clients."""
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                ["runuser", "-u", "postgres", "--", str(self.bin / "pg_ctl"), "-D",
                 str(self.data), "-m", "immediate", "-w", "stop"],
                capture_output=True, timeout=60,
            )  # fmt: skip

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class ThrowawayRedis:
    """A ``redis-server`` with no persistence on a free loopback port.

    ``also_on``: more addresses it listens on (the same port), for clients in other network
    namespaces (``tests/support/netns.py``); ``url`` stays the loopback one."""

    def __init__(self, also_on: tuple[str, ...] = ()) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServerUnavailable("redis-server is not installed")
        self.binary = binary
        self.port = free_port()
        self.also_on = also_on
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        assert self._proc is None, "already started"
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", *self.also_on]
        if self.also_on:  # explicit addresses, no password: protected mode would refuse them
            args += ["--protected-mode", "no"]
        args += ["--save", "", "--appendonly", "no", "--loglevel", "warning"]
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self._answers():
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited ({self._proc.returncode})")
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer PING within 10 s")
            time.sleep(0.02)

    def stop(self) -> None:
        """SIGKILL: nothing is flushed, every connection is cut at once."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False
