"""Property (issue 12 item 11): builder arguments, retry policies, durations and
store/lease/publisher URLs are accepted or refused with a FlowX error (a ``PlanError`` code
for the builder, ``BadURL`` for a URL with its secret redacted), never a stray exception."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import quote

import psycopg
from hypothesis import given
from hypothesis import strategies as st
from psycopg import sql
from pydantic import BaseModel

import flowx
from flowx.durations import MAX_DURATION, parse_duration
from flowx.hosting.settings import HostSettings
from flowx.hosting.stores import from_url
from flowx.outbox.urls import publisher_from_url
from flowx.urls import SCHEMA_NAME, BadURL
from tests.fuzz.support import FUZZ, names, texts

SECRET = "s3cret-9Zq"
PG = "postgresql://postgres@127.0.0.1:5432/test"


class In(BaseModel):
    n: int = 0


@flowx.capability("fuzz.plan.noop", version="1.0.0")
def noop(ctx: flowx.StepContext) -> None:
    return None


numbers = st.one_of(
    st.integers(-5, 10**12), st.floats(allow_nan=True, allow_infinity=True), st.booleans()
)
durations = st.one_of(numbers, texts, st.sampled_from(["1s", "99999999999d", "36500d", "5m"]))


@FUZZ
@given(
    flow_id=names,
    version=st.one_of(st.just("1"), names),
    step=st.one_of(st.none(), names),
    signal=names,
    sleep=durations,
    retry=st.fixed_dictionaries(
        {},
        optional={
            "attempts": numbers,
            "backoff": st.one_of(st.sampled_from(["exponential", "fixed", "none"]), texts),
            "initial": durations,
            "maximum": durations,
            "multiplier": numbers,
        },
    ),
)
def test_builder_arguments(
    flow_id: Any, version: Any, step: Any, signal: Any, sleep: Any, retry: dict[str, Any]
) -> None:
    try:
        policy = flowx.Retry(**retry)
    except flowx.PlanError as exc:
        assert exc.code == "FLOWX1027" and isinstance(exc, ValueError)
        policy = None
    if policy is not None:
        for failures in (1, 2, 50, 10_000):
            assert 0 <= policy.delay(failures) <= MAX_DURATION.total_seconds()
    try:
        (
            flowx.flow(flow_id, version=version, input=In)
            .step(noop, name=step, retry=policy)
            .await_signal(signal, dict)
            .sleep(sleep)
            .build()
        )
    except flowx.PlanError as exc:
        assert exc.code.startswith("FLOWX10")


@FUZZ
@given(value=st.one_of(durations, st.timedeltas()))
def test_durations_and_settings(value: Any) -> None:
    try:
        parsed = parse_duration(value, what="lease_ttl")
    except ValueError as exc:
        assert "lease_ttl" in str(exc)
    else:
        assert parsed <= MAX_DURATION
    with contextlib.suppress(flowx.SettingsError):
        HostSettings.load(lease_ttl=value if isinstance(value, str) else str(value))


def _url(scheme: str, user: str, tail: str, host: str, path: str, query: str) -> str:
    auth = f"{user}:{SECRET}{tail}@" if user else ""
    return f"{scheme}://{auth}{host}{path}{query}"


#: What may follow the secret in a password: the characters that break naive URL parsing.
secret_tails = st.text(st.sampled_from("/?#@:;&= %'\"x"), max_size=4)


urls = st.one_of(
    texts,
    st.builds(
        _url,
        st.sampled_from(["postgresql", "postgres", "sqlite", "redis", "amqp", "nats", "x"]),
        st.sampled_from(["", "u", ""]),
        secret_tails,
        st.one_of(st.sampled_from(["127.0.0.1", "[::1", "h:port", "h:99999", "[::1]:5"]), texts),
        st.one_of(st.sampled_from(["", "/", "/0", "/abc", "/-1", "/99999999999"]), texts),
        st.one_of(
            st.just(""),
            st.builds(lambda s: "?flowx_schema=" + quote(s, safe=""), texts),
            st.just(f"?password={SECRET}"),
        ),
    ),
)


@FUZZ
@given(url=urls, leases=st.one_of(st.none(), urls))
def test_store_lease_and_publisher_urls(url: str, leases: str | None) -> None:
    """Built, not opened (no files or schemas appear): the URL alone is judged."""
    if url.startswith("sqlite:"):  # a path, so no secret; never one that could be created
        url = "sqlite:////nonexistent-fuzz-dir/" + url.rsplit("@", 1)[-1].lstrip("/")
    for build in (lambda: from_url(url, leases=leases), lambda: publisher_from_url(url)):
        try:
            build()
        except BadURL as exc:
            assert SECRET not in str(exc) and SECRET not in exc.url
        except flowx.FlowXError as exc:
            assert SECRET not in str(exc)


@FUZZ
@given(schema=st.one_of(texts, st.from_regex(SCHEMA_NAME, fullmatch=True)))
def test_a_postgresql_schema_from_the_url(schema: str) -> None:
    """The schema rule holds for whatever ``?flowx_schema=`` says."""
    try:
        stores = from_url(f"{PG}?flowx_schema={quote(schema, safe='')}&password={SECRET}")
    except BadURL as exc:
        assert SECRET not in str(exc)
        assert schema == "" or SCHEMA_NAME.fullmatch(schema) is None
    else:
        assert schema == "" or SCHEMA_NAME.fullmatch(schema) is not None
        assert SECRET not in stores.describe()


def test_one_fuzzed_schema_opens_on_postgresql() -> None:
    """One name the rule accepts, opened for real: what passes the rule PostgreSQL takes."""
    name = st.from_regex(r"fuzz_[a-z0-9_]{0,20}", fullmatch=True)

    @FUZZ
    @given(name=name)
    def first(name: str) -> None:
        chosen.append(name)

    chosen: list[str] = []
    first()

    async def main() -> None:
        stores = from_url(f"{PG}?flowx_schema={chosen[0]}")
        await stores.open()
        await stores.close()

    try:
        asyncio.run(main())
    finally:
        with psycopg.connect(PG, autocommit=True) as conn:
            drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
            conn.execute(drop.format(sql.Identifier(chosen[0])))
