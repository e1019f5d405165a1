"""A host whose leases live in Redis, at start-up (SPEC §8 "lease store unavailable"; R7.1).

Two faults that used to look alike and must not:

- Redis down when the host opens, beside a SQLite journal: an outage. The host opens, is
  not ready, and connects by itself once Redis answers. (The retry re-opened a SQLite store
  whose thread had been shut down when the pair was closed after the first try: the
  reconnection died on its first attempt, the node never became ready, and its drain ended
  in a traceback.)
- Redis refusing the login: not an outage. redis-py raises a refused login as a
  ``ConnectionError``, so it was taken for one and the node waited for ever; it is refused
  at once now, in one line naming the URL without its password.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

import flowx
from flowx.stores.redis import RedisLeaseStore
from flowx.urls import BadURL
from tests.redis_support import REDIS_URL, drop_redis_prefix
from tests.support.servers import ServerUnavailable, ThrowawayRedis

PASSWORD = "not-the-password-5150"
WRONG_LOGIN = REDIS_URL.replace("redis://", f"redis://nobody:{PASSWORD}@")


class Job(BaseModel):
    n: int


class JobState(BaseModel):
    doubled: int | None = None


@flowx.capability("tests.start_up.double", version="1")
async def double(ctx: flowx.StepContext, job: Job) -> int:
    return job.n * 2


PLAN = (
    flowx.flow("tests.start_up", version="1", input=Job, state=JobState)
    .step(double, into="doubled")
    .build()
)


@pytest.fixture
def later_redis() -> Iterator[ThrowawayRedis]:
    """A Redis on a port of its own, not started yet."""
    try:
        redis = ThrowawayRedis()
    except ServerUnavailable as exc:
        pytest.skip(f"no throwaway Redis here: {exc}")
    try:
        yield redis
    finally:
        redis.stop()


async def test_a_sqlite_host_whose_redis_is_down_at_start_up_connects_once_it_answers(
    tmp_path: Path, later_redis: ThrowawayRedis
) -> None:
    store = flowx.with_leases(
        flowx.sqlite(tmp_path / "journal.db"), RedisLeaseStore(later_redis.url, prefix="t")
    )
    host = flowx.FlowHost(store=store, flows=[PLAN])
    await host.open()
    try:
        assert not host.ready  # up, but not ready for durable work
        with pytest.raises(flowx.JournalUnavailable):
            await host.start(PLAN, Job(n=1))
        later_redis.start()
        await host.wait_ready(timeout=30)  # the same host, by its own retries
        handle = await host.start(PLAN, Job(n=21))
        assert (await handle.result(timeout=10)).doubled == 42
    finally:
        await host.drain(timeout=5)


async def test_a_refused_redis_login_fails_the_host_at_once_by_name(tmp_path: Path) -> None:
    prefix = f"flowx-login-{uuid.uuid4().hex[:8]}"
    store = flowx.with_leases(
        flowx.sqlite(tmp_path / "journal.db"), RedisLeaseStore(WRONG_LOGIN, prefix=prefix)
    )
    host = flowx.FlowHost(store=store, flows=[PLAN])
    try:
        with pytest.raises(BadURL) as refused:
            await host.open()
    finally:
        await host.drain(timeout=5)
        await drop_redis_prefix(prefix)
    message = str(refused.value)
    assert "refused the connection" in message and "fix the URL" in message
    assert PASSWORD not in message and "\n" not in message


def test_the_worker_refuses_a_wrong_redis_login_in_one_line_and_exits_1(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "flowx.cli.main", "worker", "--db",
         f"sqlite:///{tmp_path / 'journal.db'}", "--leases", WRONG_LOGIN,
         "--flows", "tests.hosting.test_redis_leases_at_start_up:PLAN"],
        capture_output=True, text=True, timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: Redis lease store") and done.stderr.count("\n") == 1
    assert PASSWORD not in done.stderr and "Traceback" not in done.stderr
