"""Store, lease-store and publisher URLs (issue 12 item 11): a malformed URL is ``BadURL``
naming what to write, with its secrets redacted, before any driver sees it; a URL the
server refuses (a Redis database it does not have, a path SQLite cannot open) is ``BadURL``
too, once, instead of a driver exception or a reconnect loop."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import flowx
from flowx.hosting.stores import from_url
from flowx.outbox.urls import publisher_from_url
from flowx.stores.errors import StoreMisconfigured
from flowx.urls import BadURL, redact

PG = "postgresql://postgres@127.0.0.1:5432/test"
REDIS = "redis://127.0.0.1:6379"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://flowx:s3cret@db:5432/app", "postgresql://flowx:***@db:5432/app"),
        ("postgresql://:s3cret@db/app", "postgresql://:***@db/app"),
        ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("amqp://guest:p@ss:w0rd@mq:5672/", "amqp://guest:***@mq:5672/"),
        ("postgresql://db/app?password=s3cret&sslmode=require",
         "postgresql://db/app?password=***&sslmode=require"),
        ("postgresql://db/app?sslmode=require&PASSWORD=s3cret",
         "postgresql://db/app?sslmode=require&PASSWORD=***"),
        ("host=db dbname=app password=s3cret user=u", "host=db dbname=app password=*** user=u"),
        ("host=db password='s3 cret' user=flowx", "host=db password=*** user=flowx"),
        ("postgresql://db/app", "postgresql://db/app"),
        ("postgresql://u:pa/ss?w#rd@db/app", "postgresql://u:***@db/app"),
        ("redis://db:6379/0", "redis://db:6379/0"),
    ],
    ids=["user-pw", "pw-only", "redis", "at-in-pw", "query", "query-upper", "keyword",
         "keyword-quoted", "no-secret", "slash-in-pw", "port-kept"],
)  # fmt: skip
def test_redact_hides_every_password(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_redact_keeps_a_message_one_printable_line() -> None:
    shown = redact("sqlite:///a\nb\udcff" + "x" * 500)
    assert "\n" not in shown and len(shown) <= 200
    shown.encode("utf-8")  # storable and printable: no lone surrogate left


@pytest.mark.parametrize(
    ("url", "code", "says"),
    [
        ("postgresql://u:s3cret@[::1", "store.bad_url", "cannot be parsed"),
        ("postgresql://u:s3cret@h:99999/db", "store.bad_url", "cannot be parsed"),
        (PG + "?flowx_schema=Bad-Name", "store.bad_schema", "schema name 'Bad-Name'"),
        (PG + "?flowx_schema=1abc", "store.bad_schema", "lower-case SQL identifier"),
        (PG + "?flowx_schema=a;drop", "store.bad_schema", "lower-case SQL identifier"),
        ("sqlite://flowx.db", "store.bad_url", "three slashes"),
        ("sqlite:///", "store.bad_url", "has no path"),
        ("sqlite:///a\x00b.db", "store.bad_url", "NUL byte"),
        ("mongodb://u:s3cret@h/db", "store.bad_url", "unknown store URL"),
        (PG + "?password=s3cret&foo=bar", "store.bad_url", 'invalid URI query parameter: "foo"'),
    ],
)
def test_a_malformed_store_url_is_bad_url(url: str, code: str, says: str) -> None:
    with pytest.raises(BadURL) as caught:
        from_url(url)
    assert caught.value.code == code
    assert says in str(caught.value)
    assert "s3cret" not in str(caught.value) and "s3cret" not in caught.value.url


@pytest.mark.parametrize(
    ("leases", "says"),
    [
        (REDIS + "/abc", "database index 'abc' is not a number"),
        (REDIS + "/-1", "database index '-1'"),
        (REDIS + "/0?db=x", "database index 'x'"),
        (REDIS + "/99999999999", "database index '99999999999'"),
        ("redis://[::1/0", "cannot be parsed"),
        ("http://127.0.0.1:6379/0", "unknown lease store URL"),
    ],
)
def test_a_malformed_lease_url_is_bad_url(tmp_path: Path, leases: str, says: str) -> None:
    with pytest.raises(BadURL, match=says):
        from_url(f"sqlite:///{tmp_path / 'j.db'}", leases=leases)


def test_a_redis_database_the_server_does_not_have_is_bad_url_on_open(tmp_path: Path) -> None:
    async def main() -> None:
        stores = from_url(f"sqlite:///{tmp_path / 'j.db'}", leases=REDIS + "/99999")
        try:
            with pytest.raises(BadURL, match="DB index is out of range"):
                await stores.open()
        finally:
            await stores.close()

    asyncio.run(main())


def test_a_redis_url_with_a_good_index_opens(tmp_path: Path) -> None:
    async def main() -> None:
        stores = from_url(f"sqlite:///{tmp_path / 'j.db'}", leases=REDIS + "/3?flowx_prefix=t")
        await stores.open()
        await stores.close()

    asyncio.run(main())


def test_a_sqlite_directory_or_unwritable_place_is_bad_url(tmp_path: Path) -> None:
    with pytest.raises(BadURL, match="is a directory"):
        flowx.sqlite(tmp_path)
    with pytest.raises(BadURL, match="is a directory"):
        from_url(f"sqlite:///{tmp_path}")
    with pytest.raises(BadURL, match="is not a regular file"):
        from_url("sqlite:////dev/null")
    with pytest.raises(BadURL, match="File name too long"):
        flowx.sqlite(tmp_path / ("a" * 5000))

    async def proc() -> None:  # os.access never refuses root: the store's open says it
        stores = from_url("sqlite:////proc/flowx-test.db")
        try:
            with pytest.raises(BadURL, match="SQLite cannot open"):
                await stores.open()
        finally:
            await stores.close()

    asyncio.run(proc())


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere: os.access says yes")
def test_a_sqlite_file_in_a_read_only_folder_is_bad_url(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(BadURL, match="cannot be written"):
            flowx.sqlite(folder / "flowx.db")
    finally:
        folder.chmod(0o755)


def test_a_good_schema_from_the_url_is_used_on_postgresql(
    pg_schema: Callable[[], str],
) -> None:
    """The one PostgreSQL case: ``?flowx_schema=`` that passes the rule is the schema."""
    schema = pg_schema()

    async def main() -> None:
        stores = from_url(f"{PG}?flowx_schema={schema}")
        await stores.open()
        try:
            assert schema in stores.describe()
        finally:
            await stores.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("amqp://guest:s3cret@[::1", "cannot be parsed"),
        ("nats://h:notaport", "cannot be parsed"),
        ("redis://127.0.0.1:6379/x", "database index 'x'"),
        ("kafka://h:9092", "cannot publish to"),
        ("", "cannot publish to"),
        ("redis://127.0.0.1:6379/0, kafka://h", "cannot publish to"),
    ],
)
def test_a_malformed_publisher_url_is_bad_url(url: str, says: str) -> None:
    with pytest.raises(BadURL) as caught:
        publisher_from_url(url)
    assert caught.value.code == "outbox.bad_publisher_url"
    assert says in str(caught.value) and "s3cret" not in str(caught.value)


def test_a_redis_publisher_the_server_refuses_is_bad_url_and_keeps_events() -> None:
    """At open, ``BadURL``; a publish round meanwhile fails *transiently*, so no event is
    dead-lettered for a configuration mistake."""
    from flowx.outbox.redis_streams import RedisStreamsPublisher

    async def main() -> None:
        publisher = RedisStreamsPublisher(REDIS + "/99999")
        try:
            with pytest.raises(BadURL, match="DB index is out of range"):
                await publisher.open()
            event = _event()
            result = await publisher.publish([event])
            assert result.acknowledged == 0
            assert result.failure is not None and not result.failure.permanent
            assert "DB index is out of range" in result.failure.reason
        finally:
            await publisher.close()

    asyncio.run(main())


def _event() -> Any:
    from datetime import UTC, datetime

    from flowx.stores.records import EventRecord

    return EventRecord(
        event_id="e-1",
        instance_id="i-1",
        sequence=1,
        ordinal=0,
        staged_seq=1,
        type="t",
        schema_version="1",
        partition_key=None,
        payload="{}",
        published_at=None,
        staged_at=datetime.now(UTC),
    )


@pytest.mark.parametrize(
    "dsn",
    ["host=db password=s3cret extra", "host=db password=s3cret more words", "password='s3cret"],
)
def test_a_malformed_keyword_dsn_is_bad_url_without_any_of_its_secret(dsn: str) -> None:
    """libpq's own message quotes the word it choked on; a word of a password is redacted."""
    with pytest.raises(BadURL, match="is not valid") as caught:
        flowx.postgres(dsn, migrate=False)
    for word in ("s3cret", "extra", "more", "words"):
        assert word not in str(caught.value)


def test_a_database_the_server_does_not_have_is_named_in_the_error() -> None:
    """The pool's ``PoolTimeout`` hid the server's answer; the error now carries it, and it
    is a configuration error (retrying cannot create the database), not "unavailable"."""

    async def main() -> None:
        stores = from_url("postgresql://postgres@127.0.0.1:5432/flowx_no_such_db")
        try:
            with pytest.raises(StoreMisconfigured) as caught:
                await stores.open()
        finally:
            await stores.close()
        assert 'database "flowx_no_such_db" does not exist' in str(caught.value)
        assert "\n" not in str(caught.value)
        assert not isinstance(caught.value, flowx.JournalUnavailable)

    asyncio.run(main())
