"""``flowx.redaction.redact`` over every form a URL or DSN takes (R9.8: no password in any
message): each known form, then generated passwords in each form, which never come back, and
generated URLs without secrets, which come back unchanged."""

from __future__ import annotations

import logging
from urllib.parse import quote

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from flowx.redaction import RedactingFilter, redact, secrets

PW = "Pw-canary-93751"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"postgresql://u:{PW}@db:5432/app", "postgresql://u:***@db:5432/app"),
        (f"postgresql://:{PW}@db/app", "postgresql://:***@db/app"),
        (f"amqp://guest:a@b:{PW}@mq:5672/", "amqp://guest:***@mq:5672/"),
        (f"redis://u:{quote(PW + '@:/', safe='')}@h/0", "redis://u:***@h/0"),
        (f"postgresql://u:pa/ss?{PW}#x@db/app", "postgresql://u:***@db/app"),
        (f"postgresql://db/app?password={PW}&sslmode=require",
         "postgresql://db/app?password=***&sslmode=require"),
        (f"postgresql://db/app?sslpassword={PW}", "postgresql://db/app?sslpassword=***"),
        (f"postgresql://db/app?PASSWORD={PW}", "postgresql://db/app?PASSWORD=***"),
        (f"postgresql://db/app?pass%77ord={PW}", "postgresql://db/app?pass%77ord=***"),
        (f"postgresql://db/app?password=a;{PW}", "postgresql://db/app?password=***"),
        (f"s3://b/k?access_key={PW}&region=eu", "s3://b/k?access_key=***&region=eu"),
        (f"x://h/?token={PW}&api_key={PW}&client_secret={PW}",
         "x://h/?token=***&api_key=***&client_secret=***"),
        (f"host=db password={PW} user=u", "host=db password=*** user=u"),
        (f"host=db password = {PW} user=u", "host=db password = *** user=u"),
        (f"host=db password='a {PW}' user=u", "host=db password=*** user=u"),
        (f"host=db password='it\\'s {PW}' user=u", "host=db password=*** user=u"),
        (f"host=db password={PW} more words", "host=db password=***"),
        (f"host=db password='{PW}", "host=db password=***"),
        (f"u:{PW}@host", "u:***@host"),
        (f"//u:{PW}@host/db", "//u:***@host/db"),
        (f"postgresql:u:{PW}@host", "postgresql:***@host"),
        (f"nats://{PW}@h:4222", "nats://***@h:4222"),
        (f"redis://u:{PW}@h/0, amqp://g:{PW}@h2/", "redis://u:***@h/0, amqp://g:***@h2/"),
        (f"amqp://u:{PW}@[::1", "amqp://u:***@[::1"),
        (f"postgresql://u:{PW}@h:99999/db", "postgresql://u:***@h:99999/db"),
        (f"{{'password': '{PW}', 'host': 'h'}}", "{'password': ***, 'host': 'h'}"),
        ("postgresql://postgres@127.0.0.1:5432/test", "postgresql://postgres@127.0.0.1:5432/test"),
        ("redis://127.0.0.1:6379/0?flowx_prefix=a", "redis://127.0.0.1:6379/0?flowx_prefix=a"),
        ("host=db dbname=app user=u", "host=db dbname=app user=u"),
        ("sqlite:///var/a@b:c.db", "sqlite:///var/a@b:c.db"),
    ],
)  # fmt: skip
def test_each_form(text: str, shown: str) -> None:
    assert redact(text) == shown
    assert PW not in redact(text)


def test_a_driver_message_loses_every_spelling_of_the_urls_secrets() -> None:
    url = f"postgresql://u:{quote('a b@' + PW, safe='')}@h/db"
    message = f'could not connect as u with "a b@{PW}" (b@{PW}) and "a"'
    shown = redact(message, secrets_of=[url], limit=None)
    assert PW not in shown and '"a"' not in shown and shown.startswith("could not connect")


def test_one_printable_line_of_bounded_length_whatever_the_input() -> None:
    shown = redact(f"sqlite:///a\nb\udcff{'x' * 500}?password={PW}")
    assert "\n" not in shown and len(shown) <= 200 and PW not in shown
    shown.encode("utf-8")


def test_the_log_filter_redacts_message_arguments_and_tracebacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("tests.security.redaction")
    log.addFilter(RedactingFilter())
    try:
        with caplog.at_level(logging.DEBUG, logger=log.name):
            log.debug("connecting to %s", f"amqp://g:******@h/?password={PW}")
            try:
                raise RuntimeError(f"refused: amqp://g:{PW}@h/")
            except RuntimeError:
                log.exception("failed")
    finally:
        log.filters.clear()
    assert caplog.records and PW not in caplog.text


# Passwords with every character a URL or DSN parser trips on; long enough to be searched for.
passwords = st.text(
    st.one_of(st.sampled_from("@:/?#&;= %'\"\\,+"), st.characters(codec="utf-8")),
    min_size=1,
    max_size=12,
).map(lambda s: "Zq9" + s + "Xk7")
schemes = st.sampled_from(["postgresql", "postgres", "redis", "rediss", "amqp", "nats", "x-y"])
keys = st.sampled_from(["password", "sslpassword", "PASSWORD", "token", "secret", "access_key"])


@given(scheme=schemes, user=st.sampled_from(["", "u", "flowx"]), pw=passwords, enc=st.booleans())
@example(scheme="postgresql", user="", pw="Zq9://Xk7", enc=False)  # found once in CI-like run
def test_a_userinfo_password_never_comes_back(scheme: str, user: str, pw: str, enc: bool) -> None:
    written = quote(pw, safe="") if enc else pw
    url = f"{scheme}://{user}:{written}@db.example:5432/app?sslmode=require"
    assert written not in redact(url, limit=None)
    assert written not in redact(f"error: cannot reach {url} (refused)", limit=None)


@given(key=keys, pw=passwords, lead=st.sampled_from(["postgresql://db/app?", "x://h/?a=1&"]))
def test_a_query_secret_never_comes_back(key: str, pw: str, lead: str) -> None:
    url = f"{lead}{key}={quote(pw, safe='')}&sslmode=require"
    assert quote(pw, safe="") not in redact(url, limit=None)


@given(pw=passwords.filter(lambda p: "'" not in p and "\\" not in p), spaced=st.booleans())
def test_a_keyword_dsn_password_never_comes_back(pw: str, spaced: bool) -> None:
    eq = " = " if spaced else "="
    dsn = f"host=db password{eq}'{pw}' user=u"
    assert pw not in redact(dsn, limit=None)
    assert secrets(dsn)


hosts = st.from_regex(r"[a-z][a-z0-9\-]{0,10}(\.[a-z]{2,5})?", fullmatch=True)
plain = st.from_regex(r"[a-z0-9_]{1,8}", fullmatch=True)


@given(
    scheme=schemes.filter(lambda s: s != "nats"),
    user=st.one_of(st.just(""), plain.map(lambda u: u + "@")),
    host=hosts,
    port=st.one_of(st.just(""), st.integers(1, 65535).map(lambda p: f":{p}")),
    path=st.one_of(st.just(""), plain.map(lambda p: "/" + p)),
    query=st.lists(
        st.tuples(st.sampled_from(["sslmode", "flowx_schema", "db", "heartbeat"]), plain),
        max_size=3,
    ),
)
def test_a_url_without_secrets_comes_back_unchanged(
    scheme: str, user: str, host: str, port: str, path: str, query: list[tuple[str, str]]
) -> None:
    tail = ("?" + "&".join(f"{k}={v}" for k, v in query)) if query else ""
    url = f"{scheme}://{user}{host}{port}{path}{tail}"
    assert redact(url, limit=None) == url


@given(text=st.text())
def test_any_text_is_redacted_without_raising(text: str) -> None:
    redact(text)
    redact(text, secrets_of=[text])
