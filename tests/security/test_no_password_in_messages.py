"""R9.8, no password in any message: every entry point that takes a store, lease-store or
publisher URL (or a secret setting) is given one holding a known password, made to fail in
each way that produces a message, and the password is looked for in everything a person or a
log collector could see: the exception and its chained causes (str, repr, traceback), a CLI's
stdout and stderr (text and ``-o json``), and the logs at DEBUG.

The entry points, by name, so a reader sees the coverage:

* Python API: ``flowx.from_url`` (store and ``leases=``), ``flowx.postgres``, ``flowx.sqlite``,
  ``flowx.redis_leases``, ``publisher_from_url`` (what ``--publish`` uses),
  ``flowx.RedisStreamsPublisher``, ``flowx.RabbitMQPublisher``, ``flowx.NatsJetStreamPublisher``,
  ``flowx.HostSettings.load`` (the API tokens);
* CLI, in process (click's runner): ``migrate``, ``list``, ``count``, ``doctor`` (text and
  json), ``retention sweep``, each with ``--db`` and with ``FLOWX_DATABASE_URL``, and with
  ``--leases`` / ``FLOWX_LEASES_URL``;
* CLI, as processes at ``--log-level debug``: ``flowx worker`` (``--db``, ``--leases``,
  ``--publish`` and their ``FLOWX_*`` forms, a bad ``FLOWX_API_TOKEN``) and ``flowx serve``.

The failures: a scheme FlowX does not know, a URL with no scheme, bad syntax (a port that is
not a number, an unclosed ``[``), a PostgreSQL database or role that does not exist (the
server's own refusal: the test server trusts loopback, so a wrong password alone is never
asked for), a closed port, a Redis user that does not exist (``WRONGPASS``), a Redis
database it does not have, RabbitMQ's refusal of a wrong password, and a NATS port that is
closed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import flowx
from flowx.cli.main import cli
from flowx.hosting.settings import HostSettings
from flowx.outbox.urls import publisher_from_url
from tests.postgres_support import PG_DSN
from tests.support.polling import until_sync

PW = "Pw-canary-93751"
ROOT = Path(__file__).resolve().parents[2]
_PG = PG_DSN.split("://", 1)[1].rsplit("@", 1)[-1].split("/", 1)[0]  # host:port of the test server

#: Store URLs, each failing its own way, each holding the password in a different form.
STORE_URLS = {
    "unknown scheme": f"mysql://u:{PW}@db/app",
    "no scheme": f"u:{PW}@db",
    "no scheme, //": f"//u:{PW}@db/app",
    "bad port": f"postgresql://u:{PW}@db:99999/app",
    "unclosed [": f"postgresql://u:{PW}@[::1/app",
    "bad query": f"postgresql://u:{PW}@{_PG}/test?foo=bar",
    "keyword DSN": f"host=127.0.0.1 dbname=test password='a {PW}'",
    "no such database": f"postgresql://postgres:{PW}@{_PG}/no_such_db_r98",
    "no such role": f"postgresql://no_such_role_r98:{PW}@{_PG}/test",
    "password in the query": f"postgresql://postgres@{_PG}/no_such_db_r98?password={PW}",
    "sslpassword": f"postgresql://postgres@{_PG}/no_such_db_r98?sslpassword={PW}",
    "closed port": f"postgresql://postgres:{PW}@127.0.0.1:1/test?connect_timeout=2",
    "percent-encoded": f"postgresql://postgres:{PW}%40x@{_PG}/no_such_db_r98",
    "sqlite, missing folder": f"sqlite:///no-such-dir-r98/x.db?password={PW}",
}
#: Lease-store URLs (``--leases``), with a good journal.
LEASE_URLS = {
    "unknown scheme": f"memcache://u:{PW}@h",
    "no scheme": f"u:{PW}@h",
    "no such user": f"redis://no_such_user_r98:{PW}@127.0.0.1:6379/0",
    "no such database": f"redis://:{PW}@127.0.0.1:6379/99",
    "closed port": f"redis://u:{PW}@127.0.0.1:1/0",
    "bad port": f"redis://u:{PW}@h:99999/0",
}
#: Publisher URLs (``--publish``).
PUBLISH_URLS = {
    "unknown scheme": f"kafka://u:{PW}@h",
    "no scheme": f"u:{PW}@h",
    "second of several": f"redis://127.0.0.1:6379/0,kafka://u:{PW}@h",
    "redis, no such user": f"redis://no_such_user_r98:{PW}@127.0.0.1:6379/0",
    "rabbitmq, wrong password": f"amqp://guest:{PW}@127.0.0.1:5672/",
    "rabbitmq, password in the query": f"amqp://guest:guest@127.0.0.1:5672/no_vhost?password={PW}",
    "rabbitmq, closed port": f"amqp://guest:{PW}@127.0.0.1:1/",
    "nats, closed port": f"nats://u:{PW}@127.0.0.1:1",
    "nats token, closed port": f"nats://{PW}@127.0.0.1:1",
}


def everything_shown(exc: BaseException) -> str:
    """The exception and every cause and context under it: str, repr and the traceback."""
    seen: set[int] = set()
    parts: list[str] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        parts += [str(e), repr(e), "".join(traceback.format_exception(e))]
        todo += [e.__cause__, e.__context__]
    return "\n".join(parts)


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG):
        yield caplog


def assert_hidden(text: str, where: str) -> None:
    assert PW not in text, f"the password shows in {where}:\n{text}"


async def _opened(stores: Any) -> None:
    try:
        await stores.open()
    finally:
        await stores.close()


async def _published(publisher: Any) -> Any:
    try:
        await publisher.open()
        return await publisher.publish([])
    finally:
        await publisher.close()


def _through(call: Callable[[], Awaitable[Any]], logs: pytest.LogCaptureFixture) -> str:
    """What an entry point shows: its result or its error, and the logs."""
    try:
        result = asyncio.run(asyncio.wait_for(call(), 60))
    except Exception as exc:
        shown = everything_shown(exc)
    else:
        shown = repr(result)
    return shown + "\n" + logs.text


@pytest.mark.parametrize("url", STORE_URLS.values(), ids=STORE_URLS.keys())
def test_python_api_stores(url: str, debug_logs: pytest.LogCaptureFixture) -> None:
    assert_hidden(_through(lambda: _opened(flowx.from_url(url)), debug_logs), "from_url")
    if url.startswith("postgresql://"):
        shown = _through(lambda: _opened(flowx.postgres(url)), debug_logs)
        assert_hidden(shown, "flowx.postgres")


def test_python_api_sqlite(debug_logs: pytest.LogCaptureFixture) -> None:
    shown = _through(lambda: _opened(flowx.sqlite(f"no-such-dir-r98/a?password={PW}")), debug_logs)
    assert "no-such-dir-r98" in shown  # it did fail, naming the path
    assert_hidden(shown, "flowx.sqlite")


@pytest.mark.parametrize("url", LEASE_URLS.values(), ids=LEASE_URLS.keys())
def test_python_api_lease_stores(
    url: str, tmp_path: Path, debug_logs: pytest.LogCaptureFixture
) -> None:
    db = f"sqlite:///{tmp_path / 'j.db'}"
    shown = _through(lambda: _opened(flowx.from_url(db, leases=url)), debug_logs)
    assert_hidden(shown, "from_url(leases=)")
    if url.startswith("redis://") and "99999" not in url:
        shown = _through(lambda: _opened(flowx.redis_leases(url)), debug_logs)
        assert_hidden(shown, "flowx.redis_leases")


@pytest.mark.parametrize("url", PUBLISH_URLS.values(), ids=PUBLISH_URLS.keys())
def test_python_api_publishers(url: str, debug_logs: pytest.LogCaptureFixture) -> None:
    shown = _through(lambda: _published(publisher_from_url(url)), debug_logs)
    assert_hidden(shown, "publisher_from_url")


def _event() -> Any:
    """One event to publish, so a publish round runs and fails."""
    from flowx.stores.records import EventRecord

    return EventRecord(
        event_id="e-r98", instance_id="i-r98", sequence=1, ordinal=0, staged_seq=1,
        type="r98.test", schema_version="1", partition_key=None, payload="{}",
        published_at=None,
    )  # fmt: skip


@pytest.mark.parametrize(
    "build",
    [
        lambda: flowx.RedisStreamsPublisher(f"redis://no_such_user_r98:{PW}@127.0.0.1:6379/0"),
        lambda: flowx.RabbitMQPublisher(f"amqp://guest:{PW}@127.0.0.1:5672/"),
        lambda: flowx.NatsJetStreamPublisher(f"nats://u:{PW}@127.0.0.1:1", timeout=2),
    ],
    ids=["redis-streams", "rabbitmq", "nats"],
)
def test_python_api_publisher_classes(
    build: Callable[[], Any], debug_logs: pytest.LogCaptureFixture
) -> None:
    async def publish_one() -> Any:
        publisher = build()
        try:
            try:
                await publisher.open()
            except Exception as exc:  # open's refusal is shown too; publish still runs
                logging.getLogger("tests").debug("open: %s", everything_shown(exc))
            return await publisher.publish([_event()])
        finally:
            await publisher.close()

    shown = _through(publish_one, debug_logs)
    assert "failure=PublishFailure" in shown or "Error" in shown  # it did fail
    assert_hidden(shown, "a publisher's failure reason")


@pytest.mark.parametrize(
    "tokens",
    [{"api_token": PW}, {"api_token": "x" * 20 + PW, "api_read_token": "x" * 20 + PW}],
    ids=["too short", "the same twice"],
)
def test_settings_model(tokens: dict[str, str]) -> None:
    with pytest.raises(flowx.SettingsError) as caught:
        HostSettings.load(**tokens)
    assert_hidden(everything_shown(caught.value), "HostSettings.load")


def _cli(args: list[str], env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(cli, args, env=env)
    shown = result.stdout + result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        shown += everything_shown(result.exception)
    assert result.exit_code != 0, shown  # each of these must fail, and say so
    return shown


READ_COMMANDS = [["migrate"], ["list"], ["count"], ["doctor"], ["doctor", "-o", "json"],
                 ["list", "-o", "json"], ["retention", "sweep", "--dry-run"]]  # fmt: skip


@pytest.mark.parametrize("url", STORE_URLS.values(), ids=STORE_URLS.keys())
def test_cli_db_option_and_env(url: str, debug_logs: pytest.LogCaptureFixture) -> None:
    """Every failure, through ``--db`` (text) and ``FLOWX_DATABASE_URL`` (``-o json``)."""
    assert_hidden(_cli(["migrate", "--db", url]), "flowx migrate --db")
    shown = _cli(["doctor", "-o", "json"], env={"FLOWX_DATABASE_URL": url})
    assert_hidden(shown, "flowx doctor -o json, FLOWX_DATABASE_URL")
    assert_hidden(debug_logs.text, "the logs")


@pytest.mark.parametrize("url", ["no such role", "no scheme", "bad port"])
@pytest.mark.parametrize("command", READ_COMMANDS, ids=" ".join)
def test_cli_every_command_with_a_db(
    command: list[str], url: str, debug_logs: pytest.LogCaptureFixture
) -> None:
    """Every command that opens a store, each failing on the server and before it."""
    shown = _cli([*command, "--db", STORE_URLS[url]])
    assert_hidden(shown + debug_logs.text, f"flowx {' '.join(command)} --db")


LEASE_COMMANDS = [
    ["start", "cli.greeting", "--flows", "tests.cli.cli_flows:FLOWS", "--input", '{"name": "a"}'],
    ["retention", "sweep", "--dry-run", "-o", "json"],
]


@pytest.mark.parametrize("url", LEASE_URLS.values(), ids=LEASE_URLS.keys())
@pytest.mark.parametrize("command", LEASE_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_cli_leases_option_and_env(command: list[str], url: str, tmp_path: Path) -> None:
    """The commands that take ``--leases``, through the option and ``FLOWX_LEASES_URL``."""
    db = f"sqlite:///{tmp_path / 'j.db'}"
    CliRunner().invoke(cli, ["migrate", "--db", db])  # a journal to open: the leases fail
    assert_hidden(_cli([*command, "--db", db, "--leases", url]), "--leases")
    env = {"FLOWX_LEASES_URL": url, "FLOWX_DATABASE_URL": db}
    assert_hidden(_cli(command, env=env), "FLOWX_LEASES_URL")


def _process(args: list[str], env: dict[str, str], ready: Path) -> str:
    """``flowx ARGS --ready-file READY`` as its own process at DEBUG; what it printed. A run
    refused at start exits by itself; one that starts all the same (a broker that is down
    stops no worker) is stopped with SIGTERM once it says it is ready, having logged what it
    met on the way."""
    full = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    for name in ("FLOWX_DATABASE_URL", "FLOWX_LEASES_URL", "FLOWX_PUBLISH_URL"):
        if name not in env:
            full.pop(name, None)
    out, err = ready.with_suffix(".out"), ready.with_suffix(".err")
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flowx.cli.main", *args, "--ready-file", str(ready)],
            stdout=o, stderr=e, env=full, cwd=ROOT,
        )  # fmt: skip
        try:
            until_sync(
                lambda: proc.poll() is not None or ready.exists(),
                within=60,
                what=f"flowx {args[0]} to exit or be ready",
            )
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    return out.read_text() + err.read_text()


FLOWS = ["--flows", "tests.cli.cli_flows:FLOWS"]
WORKER_CASES = {
    # A journal that does not answer yet (a closed port, a folder not there) is waited for:
    # those are covered by the in-process commands above.
    **{
        f"--db {k}": (["--db", u], {})
        for k, u in STORE_URLS.items()
        if "closed" not in k and "sqlite" not in k
    },
    "FLOWX_DATABASE_URL": ([], {"FLOWX_DATABASE_URL": STORE_URLS["no such role"]}),
    # A lease store that refuses its user is waited for like a journal that is down (the
    # in-process commands and the Python API cover that refusal): these are refused at once.
    "--leases": (["--leases", LEASE_URLS["no scheme"]], {}),
    "FLOWX_LEASES_URL": ([], {"FLOWX_LEASES_URL": LEASE_URLS["bad port"]}),
    "--publish": (["--publish", PUBLISH_URLS["rabbitmq, password in the query"]], {}),
    "--publish redis": (["--publish", PUBLISH_URLS["redis, no such user"]], {}),
    "FLOWX_PUBLISH_URL": ([], {"FLOWX_PUBLISH_URL": PUBLISH_URLS["no scheme"]}),
    "FLOWX_API_TOKEN": ([], {"FLOWX_API_TOKEN": PW}),
}


@pytest.mark.parametrize(("extra", "env"), WORKER_CASES.values(), ids=WORKER_CASES.keys())
def test_worker_process(extra: list[str], env: dict[str, str], tmp_path: Path) -> None:
    db = ["--db", f"sqlite:///{tmp_path / 'j.db'}"] if "--db" not in extra else []
    db = [] if "FLOWX_DATABASE_URL" in env else db
    args = ["worker", *FLOWS, *db, *extra, "--log-level", "debug", "--log-format", "json"]
    assert_hidden(_process(args, env, tmp_path / "ready"), f"flowx {' '.join(args)}")


SERVE_CASES = {
    "--db no such database": (["--db", STORE_URLS["no such database"]], {}),
    "--db no scheme": (["--db", STORE_URLS["no scheme"]], {}),
    "FLOWX_DATABASE_URL": ([], {"FLOWX_DATABASE_URL": STORE_URLS["unknown scheme"]}),
    "--leases": (["--leases", LEASE_URLS["no such user"]], {}),
    "FLOWX_API_TOKEN": ([], {"FLOWX_API_TOKEN": PW}),
}


@pytest.mark.parametrize(("extra", "env"), SERVE_CASES.values(), ids=SERVE_CASES.keys())
def test_serve_process(extra: list[str], env: dict[str, str], tmp_path: Path) -> None:
    db = ["--db", f"sqlite:///{tmp_path / 'j.db'}"] if "--db" not in extra else []
    db = [] if "FLOWX_DATABASE_URL" in env else db
    args = ["serve", *FLOWS, *db, *extra, "--port", "0", "--log-level", "debug"]
    assert_hidden(_process(args, env, tmp_path / "ready"), f"flowx {' '.join(args)}")


@pytest.mark.parametrize("output", ["text", "json"])
def test_doctor_prints_the_resolved_settings_without_the_tokens(
    output: str, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'j.db'}"
    CliRunner().invoke(cli, ["migrate", "--db", db])
    env = {"FLOWX_API_TOKEN": f"{PW}-admin", "FLOWX_API_READ_TOKEN": f"{PW}-read"}
    result = CliRunner().invoke(cli, ["doctor", "--db", db, "-o", output], env=env)
    assert "api_token" in result.stdout  # the settings were printed
    assert_hidden(result.stdout + result.stderr, f"flowx doctor -o {output}")
