"""Secrets taken out of text before anyone sees it: URLs, DSNs, driver messages, log lines (R9.8).

Every error and log line that can quote a store, lease-store or publisher URL shows it through
``redact``: a message goes to a terminal, a log collector, an HTTP response or a ticket, and a
password in it is a password leaked. One function, so every path hides the same forms:

* a URL's userinfo: ``scheme://user:pw@host``, ``scheme://:pw@host``, a password holding ``@``,
  ``:``, ``/`` or percent-escapes; a NATS token (``nats://token@host``); several URLs in one
  text (``redis://…,amqp://…``); a URL with no scheme (``user:pw@host``, ``//user:pw@host``);
* a parameter whose name says it is a secret (holds ``pass``, ``pwd``, ``secret``, ``token``,
  ``key``, ``credential``, ``auth`` or ``signature``, in any case, percent-encoded or not),
  in a query (``?password=pw``, ``&sslpassword=pw``, ``?access_key=…``), in a libpq keyword DSN
  (``password=pw``, ``password = pw``, ``password='a b'``) or in a mapping's text
  (``{'password': 'pw'}``);
* given the URL a driver was handed (``secrets_of``), every spelling of its secrets wherever
  the driver's own message quotes them (raw, percent-decoded, unquoted, word by word).

What cannot be parsed is redacted conservatively: from the first ``:`` of an authority to its
last ``@``, and from a secret's ``=`` to the next ``key=``. Hiding too much costs a clue; hiding
too little costs a password.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from typing import Final
from urllib.parse import unquote, unquote_plus

REDACTED: Final = "***"
#: A parameter whose name holds one of these is a secret.
SECRET_WORDS: Final = ("pass", "pwd", "secret", "token", "key", "credential", "auth", "signature")
#: Schemes whose userinfo without a ``:`` is itself a secret (NATS token authentication).
_TOKEN_SCHEMES: Final = frozenset({"nats", "tls", "ws", "wss"})
#: The longest text shown by default: a message is one readable line.
DEFAULT_LIMIT: Final = 200

#: A URL starts where text starts or after a separator (a blank, a comma, a quote, ``=``, a
#: bracket), never inside another URL's password (``user:pw://x@host`` is one URL).
_SCHEME = re.compile(r"(?:^|(?<=[\s,;'\"=(\[<{|]))(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://")
#: ``user:pw@`` where the password holds no ``/``, ``?`` or ``#`` (up to its last ``@``).
_USERINFO = re.compile(r"[^/?#:@]*:(?P<pw>[^/?#]*)@")
#: The same in a malformed URL: up to the last ``@`` before the next URL. It may hide more
#: than the password; never less.
_USERINFO_LOOSE = re.compile(r"[^/?#:@]*:(?P<pw>.*)@", re.DOTALL)
_TOKEN = re.compile(r"(?P<pw>[^/?#:@]+)@")
_TOKEN_LOOSE = re.compile(r"(?P<pw>[^:]+)@", re.DOTALL)
#: ``user:pw@host`` with no ``scheme://`` (``//`` allowed): up to the last ``@``.
_BARE_USERINFO = re.compile(
    r"(?:^|(?<=[\s,'\"=(]))(?://)?[^\s/?#:@,'\"=()]*:(?P<pw>.*)@", re.DOTALL
)
#: ``key=`` (a query or a keyword DSN), or ``'key':`` / ``"key":`` (a mapping's text).
_KEY = re.compile(
    r"(?<![\w.%\-])(?:(?P<quote>['\"])(?P<qkey>[\w.%\-]+)(?P=quote)\s*[:=]"
    r"|(?P<key>[A-Za-z_%][\w.%\-]*)\s*=)\s*"
)
_QUOTED = {
    "'": re.compile(r"'(?:[^'\\]|\\.)*(?:'|$)", re.DOTALL),
    '"': re.compile(r'"(?:[^"\\]|\\.)*(?:"|$)', re.DOTALL),
}
#: A query value: up to the next ``&`` or blank.
_QUERY_VALUE = re.compile(r"[^&\s]+")
#: A keyword DSN's value: libpq ends it at a blank (``\`` escapes one), but the words after it
#: up to the next ``key=`` may be more of a mistyped password (``password=abc def``).
_KEYWORD_VALUE = re.compile(r"(?:\\.|\S)+(?:\s+(?![\w.%\-]+\s*=)(?:\\.|\S)+)*")
_QUOTED_FRAGMENT = re.compile(r"\"([^\"]*)\"|'([^']*)'")
#: Words of a password shorter than this are left alone in a driver's message (a one-letter
#: word would blank every ``a`` in it); a quoted fragment equal to one is still hidden.
_MIN_WORD = 4


def is_secret_key(name: str) -> bool:
    """Whether a query or DSN parameter named ``name`` holds a secret."""
    plain = unquote(name).lower()
    return any(word in plain for word in SECRET_WORDS)


def redact(text: str, *, secrets_of: Iterable[str] = (), limit: int | None = DEFAULT_LIMIT) -> str:
    """``text`` with every secret replaced by ``***``, as one printable line.

    ``text`` may be a URL, a keyword DSN, several URLs, or a message quoting any of them.
    ``secrets_of``: URLs or DSNs whose secrets are also hidden wherever ``text`` spells them
    out (a driver's message about the connection it was given). ``limit``: the longest result
    (``None``: whole). Never raises on any ``str``.
    """
    shown = _cut(text, _spans(text))
    forms = _secret_forms(secrets_of)
    if forms:
        shown = _QUOTED_FRAGMENT.sub(lambda m: _quoted(m, forms), shown)
        for secret in _searchable(forms):
            shown = shown.replace(secret, REDACTED)
    shown = shown.encode("utf-8", "backslashreplace").decode("utf-8")
    shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in shown)
    if limit is not None and len(shown) > limit:
        return shown[: max(0, limit - 3)] + "..."
    return shown


def secrets(text: str) -> set[str]:
    """Every secret ``text`` (a URL or DSN) holds, as written there."""
    return {text[a:b] for a, b in _spans(text)}


def _spans(text: str) -> list[tuple[int, int]]:
    """Where the secrets are in ``text``, merged and in order."""
    found = sorted(s for s in (*_userinfo_spans(text), *_param_spans(text)) if s[1] > s[0])
    merged: list[tuple[int, int]] = []
    for start, end in found:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    out, at = [], 0
    for start, end in spans:
        out += [text[at:start], REDACTED]
        at = end
    out.append(text[at:])
    return "".join(out)


def _userinfo_spans(text: str) -> Iterator[tuple[int, int]]:
    starts = list(_SCHEME.finditer(text))
    if not starts:
        for m in _BARE_USERINFO.finditer(text):
            yield m.span("pw")
        return
    for i, found in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        at = found.end()
        token = found["scheme"].lower() in _TOKEN_SCHEMES
        for pattern in (_USERINFO, _USERINFO_LOOSE, *((_TOKEN, _TOKEN_LOOSE) if token else ())):
            m = pattern.match(text, at, end)
            if m is not None:
                yield m.span("pw")
                break


def _param_spans(text: str) -> Iterator[tuple[int, int]]:
    for m in _KEY.finditer(text):
        if not is_secret_key(m["qkey"] or m["key"]):
            continue
        at = m.end()
        if at >= len(text):
            continue
        quoted = _QUOTED.get(text[at])
        if quoted is not None:
            value = quoted.match(text, at)
        elif m["key"] and m.start() > 0 and text[m.start() - 1] in "?&;":
            value = _QUERY_VALUE.match(text, at)
        else:
            value = _KEYWORD_VALUE.match(text, at)
        if value is not None:
            yield value.span()


def _secret_forms(urls: Iterable[str]) -> set[str]:
    """Each secret of ``urls`` as a driver may spell it: raw, unquoted, percent-decoded, and
    each of its words long enough to search for."""
    forms: set[str] = set()
    for url in urls:
        for raw in secrets(url):
            for form in (raw, raw.strip("'\""), raw.strip("'\"").replace("\\", "")):
                forms |= {form, unquote(form), unquote_plus(form)}
    words = {w for f in forms for w in f.split()}
    return {f for f in forms | words if f}


def _searchable(forms: set[str]) -> list[str]:
    """The forms worth replacing wherever they occur, longest first: a short word of a
    password (``a``) would blank every ``a`` of a message; a quoted fragment equal to it is
    hidden all the same (``_quoted``)."""
    return sorted((f for f in forms if len(f) >= _MIN_WORD), key=len, reverse=True)


def _quoted(m: re.Match[str], forms: set[str]) -> str:
    """A quoted fragment of a driver's message (libpq: ``missing "=" after "pw"``) that is a
    secret, or a word of one, however short."""
    inner = m[1] if m[1] is not None else m[2]
    if inner and inner in forms:
        quote = m[0][0]
        return f"{quote}{REDACTED}{quote}"
    return m[0]


class RedactingFilter(logging.Filter):
    """A log record's message and traceback with ``redact`` applied: drivers log the URLs
    they were given (aio-pika masks a userinfo password, not ``?password=``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not fit its format: shown as is
            return True
        shown = redact(message, limit=None)
        if shown != message:
            record.msg, record.args = shown, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(
                logging.Formatter().formatException(record.exc_info), limit=None
            )
        return True


_FILTER: Final = RedactingFilter()


def guard_logs(*names: str) -> None:
    """Put ``RedactingFilter`` on the loggers named and on every logger below them that
    exists now (a filter on a logger sees only what is logged to it, not to its children).
    Call it after importing the driver whose loggers it guards; calling it again is cheap."""
    manager = logging.Logger.manager
    for existing in [*manager.loggerDict]:
        if any(existing == n or existing.startswith(n + ".") for n in names):
            logger = logging.getLogger(existing)
            if _FILTER not in logger.filters:
                logger.addFilter(_FILTER)
    for name in names:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
