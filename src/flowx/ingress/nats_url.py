"""The NATS JetStream ingress URL, ``nats://host:4222/<stream>/<consumer>?...``, checked and
taken apart before any connection (``flowx.ingress.nats_jetstream`` documents what each part
does). A mistake in it can never succeed on a retry, so it is ``BadURL`` at once, in one line,
with the URL's secrets redacted."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlunsplit

from flowx.outbox.nats_jetstream import TLS_PARAMS
from flowx.redaction import redact
from flowx.urls import BadURL, check_text, split, take_params

__all__ = ["CODE", "NatsTarget", "covers", "parse_url"]

CODE: Final = "ingress.bad_url"
_USAGE: Final = (
    "use nats://host:4222/<stream>/<consumer> (or tls://...), optionally with "
    "?dead_subject=<subject prefix>, batch=, ack_wait=, max_ack_pending=, filter=, tls_ca=, "
    "tls_cert=, tls_key="
)
#: The URL's numeric parameters: (smallest, default).
_NUMBERS: Final = {"batch": (1, 64), "ack_wait": (1, 30), "max_ack_pending": (1, 1_000)}
#: A stream or consumer name JetStream accepts: no '.', '*', '>', space or path separator.
_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,200}")
#: A literal subject: dot-separated tokens, no wildcards, no white space.
_SUBJECT: Final = re.compile(r"[^.*>\s]+(\.[^.*>\s]+)*")
#: A subject filter: tokens, each ``*`` or literal, the last may be ``>``.
_FILTER: Final = re.compile(r"([^.*>\s]+|\*)(\.([^.*>\s]+|\*))*(\.>)?|>")


@dataclass(frozen=True)
class NatsTarget:
    """A parsed ingress URL: ``server`` is what nats-py connects to (no path, no FlowX
    parameters), ``shown`` the URL with its secrets redacted."""

    server: str
    stream: str
    consumer: str
    dead_prefix: str
    tls_files: dict[str, str]
    shown: str
    batch: int = 64
    ack_wait: float = 30.0
    max_ack_pending: int = 1_000
    subject_filter: str | None = None

    @property
    def wants_tls(self) -> bool:
        return bool(self.tls_files) or self.server.startswith("tls://")


def parse_url(url: str) -> NatsTarget:
    """``url`` checked and taken apart; ``BadURL`` naming what is wrong otherwise."""
    check_text(url, "NATS ingress")
    shown = redact(url)
    server, params = take_params(url, lambda _name: True)
    unknown = sorted(set(params) - {"dead_subject", "filter", *_NUMBERS, *TLS_PARAMS})
    if unknown:
        raise BadURL(
            f"NATS ingress URL {shown!r}: unknown parameter {unknown[0]!r}; {_USAGE}",
            url=shown,
            code=CODE,
        )
    parts = split(server, "NATS ingress", code=CODE)
    segments = parts.path.strip("/").split("/") if parts.path.strip("/") else []
    if parts.scheme not in ("nats", "tls") or not parts.hostname or len(segments) != 2:
        raise BadURL(f"NATS ingress URL {shown!r} is not usable: {_USAGE}", url=shown, code=CODE)
    stream, consumer = segments
    for what, name in (("stream", stream), ("consumer", consumer)):
        if not _NAME.fullmatch(name):
            raise BadURL(
                f"NATS ingress URL {shown!r}: {what} name {redact(name)!r} may hold only "
                "letters, digits, '-' and '_'",
                url=shown,
                code=CODE,
            )
    dead_prefix = params.get("dead_subject") or f"flowx.dead.{stream}"
    if not _SUBJECT.fullmatch(dead_prefix):
        raise BadURL(
            f"NATS ingress URL {shown!r}: dead_subject {redact(dead_prefix)!r} must be a "
            "subject without wildcards or spaces, e.g. dead_subject=orders_dead",
            url=shown,
            code=CODE,
        )
    subject_filter = params.get("filter") or None
    if subject_filter is not None and not _FILTER.fullmatch(subject_filter):
        raise BadURL(
            f"NATS ingress URL {shown!r}: filter {redact(subject_filter)!r} must be a subject, "
            "with '*' for one token and a last '>' for the rest, e.g. filter=orders.eu.>",
            url=shown,
            code=CODE,
        )
    tls_files = {k: v for k, v in params.items() if k in TLS_PARAMS}
    numbers = {k: _number(params, k, shown) for k in _NUMBERS}
    server_url = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
    return NatsTarget(
        server_url,
        stream,
        consumer,
        dead_prefix,
        tls_files,
        shown,
        batch=int(numbers["batch"]),
        ack_wait=numbers["ack_wait"],
        max_ack_pending=int(numbers["max_ack_pending"]),
        subject_filter=subject_filter,
    )


def _number(params: dict[str, str], name: str, shown: str) -> float:
    """The URL's ``name`` parameter, or its default; ``BadURL`` for one out of range."""
    least, default = _NUMBERS[name]
    text = params.get(name)
    if text is None:
        return float(default)
    try:
        value = float(text) if name == "ack_wait" else int(text)
    except ValueError:
        value = least - 1
    if not least <= value <= 10**9:
        raise BadURL(
            f"NATS ingress URL {shown!r}: {name}={redact(text)!r} must be a number of at "
            f"least {least} (default {default})",
            url=shown,
            code=CODE,
        )
    return float(value)


def covers(pattern: str, subject: str) -> bool:
    """Whether the stream subject ``pattern`` overlaps ``subject`` (both may hold ``*`` and a
    trailing ``>``): a dead letter published under ``subject`` would land in its stream."""
    a, b = pattern.split("."), subject.split(".")
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x == ">" or y == ">":
            return True
        if x != y and "*" not in (x, y):
            return False
        if i == min(len(a), len(b)) - 1 and len(a) == len(b):
            return True
    return False
