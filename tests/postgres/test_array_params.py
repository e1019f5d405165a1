"""The batched statements' array parameters (``flowx.stores.postgres.arrays``) reach
PostgreSQL as the values they hold: each typed list is read back by the server, element by
element, exactly as psycopg's own list dumper would have sent it (R6.2's batches carry the
same rows as single writes). A value the type cannot hold is refused before anything is
sent, as one write's data (R9.5), never as a batch-wide failure."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from flowx.stores.postgres.arrays import BigInts, Bools, Ints, Texts, Times
from flowx.stores.postgres.batching import isolatable
from tests.postgres_support import PG_DSN

T = datetime(2026, 12, 7, 3, 4, 5, 123456, tzinfo=UTC)
EAST = datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=5)))


@pytest.fixture
async def conn() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as c:
        yield c


async def read_back(conn: psycopg.AsyncConnection[Any], value: Any, sql_type: str) -> Any:
    row = await (await conn.execute(f"SELECT %b::{sql_type}", (value,))).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0]


@pytest.mark.parametrize(
    ("value", "sql_type"),
    [
        (Texts(["a", None, "ünïcödé €", "", "x" * 10_000]), "text[]"),
        (Texts([]), "text[]"),
        (Texts([None, None]), "text[]"),
        (Ints([1, None, -5, 2**31 - 1, -(2**31)]), "int[]"),
        (Ints([]), "int[]"),
        (BigInts([2**62, None, -1, 0]), "bigint[]"),
        (Bools([True, None, False]), "bool[]"),
        (Times([T, None, EAST]), "timestamptz[]"),
        (Times([None]), "timestamptz[]"),
    ],
)
async def test_each_typed_list_reads_back_as_it_was(
    conn: psycopg.AsyncConnection[Any], value: list[Any], sql_type: str
) -> None:
    assert await read_back(conn, value, sql_type) == list(value)


async def test_ids_sent_as_text_are_cast_to_uuid_by_the_server(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    ids = [str(uuid.uuid4()) for _ in range(3)]
    got = await read_back(conn, Texts([*ids, None]), "uuid[]")
    assert [str(g) if g is not None else None for g in got] == [*ids, None]


async def test_the_server_reads_what_psycopg_itself_would_have_sent(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    """Same query, the same values once as a plain list (psycopg's dumper) and once typed."""
    plain: list[Any] = ["b", None, "ä"]
    assert await read_back(conn, Texts(plain), "text[]") == await read_back(conn, plain, "text[]")
    times: list[Any] = [T, None]
    assert await read_back(conn, Times(times), "timestamptz[]") == await read_back(
        conn, times, "timestamptz[]"
    )


async def test_an_integer_out_of_range_is_one_writes_data_error(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    with pytest.raises(psycopg.DataError, match="32-bit") as caught:
        await read_back(conn, Ints([1, 2**40]), "int[]")
    assert isolatable(caught.value)  # the batch is retried write by write, not failed whole


async def test_a_lone_surrogate_is_refused_before_anything_is_sent(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    with pytest.raises(UnicodeEncodeError) as caught:
        await read_back(conn, Texts(["ok", "\ud800"]), "text[]")
    assert isolatable(caught.value)
    assert await read_back(conn, Texts(["still usable"]), "text[]") == ["still usable"]


async def test_a_naive_time_is_one_writes_data_error(conn: psycopg.AsyncConnection[Any]) -> None:
    with pytest.raises(psycopg.DataError, match="naive datetime") as caught:
        await read_back(conn, Times([datetime(2026, 1, 1)]), "timestamptz[]")
    assert isolatable(caught.value)


async def test_a_bigint_out_of_range_and_empty_columns(conn: psycopg.AsyncConnection[Any]) -> None:
    with pytest.raises(psycopg.DataError, match="64-bit"):
        await read_back(conn, BigInts([2**63]), "bigint[]")
    for value, sql_type in (
        (Bools([]), "bool[]"),
        (BigInts([]), "bigint[]"),
        (Times([]), "timestamptz[]"),
    ):
        assert await read_back(conn, value, sql_type) == []
    plain: list[Any] = [1, None, 2**40]
    assert await read_back(conn, BigInts(plain), "bigint[]") == await read_back(
        conn, plain, "bigint[]"
    )
    flags: list[Any] = [True, None, False]
    assert await read_back(conn, Bools(flags), "bool[]") == await read_back(conn, flags, "bool[]")
