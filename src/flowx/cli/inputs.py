"""JSON given on the command line (``--input``, ``--input-file``, ``--payload``), checked
before a host sees it.

What the shell hands over is not always text: argv that is not UTF-8 reaches Python as lone
surrogates (PEP 383), a file may hold any bytes, and JSON may nest deeper than the parser's
recursion allows. Each of these is a mistake on the command line, so each is a usage error
(exit 2) naming the option and the fix — never a ``UnicodeDecodeError`` or
``RecursionError`` traceback, and never a driver error half-way through a commit (R9.5).

The text itself is what the host validates (pydantic reads JSON text, with JSON's rules for
dates and the like); the parse here only proves it is JSON FlowX can store.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import click

from flowx import codec
from flowx.errors import InputUnreadable
from flowx.names import name_problem

#: PEP 383: a byte that is not UTF-8 in argv arrives as U+DC80..U+DCFF.
_ESCAPED_BYTES: Final = range(0xDC80, 0xDD00)


class TextArgsGroup(click.Group):
    """The ``flowx`` group: every argument must be text. A non-UTF-8 argument (an instance
    id, a flow id, a key) is refused up front as a usage error naming it, instead of a
    ``UnicodeEncodeError`` from a driver deep inside a command."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for position, arg in enumerate(args, start=1):
            bad = next((c for c in arg if ord(c) in _ESCAPED_BYTES), None)
            if bad is not None:
                raise click.UsageError(
                    f"argument {position} ({arg!r}) is not UTF-8: byte "
                    f"0x{ord(bad) - 0xDC00:02x}; pass UTF-8 text (check the terminal's or "
                    "the script's encoding)",
                    ctx=ctx,
                )
        return super().parse_args(ctx, args)


#: The error code of input that is not JSON text FlowX can read: a usage error (exit 2).
INPUT_UNREADABLE: Final = InputUnreadable.code


def input_text(input_json: str | None, input_file: Path | None) -> tuple[str, Any]:
    """The ``flowx start`` input as JSON text and its value (``{}`` when neither is given)."""
    if input_json is not None and input_file is not None:
        raise click.UsageError("give --input or --input-file, not both")
    if input_file is not None:
        return checked(read_file(input_file, "--input-file"), "--input-file")
    return checked(input_json or "{}", "--input")


def payload_text(payload: str) -> tuple[str, Any]:
    """The ``flowx signal`` payload as JSON text and its value."""
    return checked(payload, "--payload")


def read_file(path: Path, option: str) -> str:
    """A file's text, which must be UTF-8 (a leading byte-order mark is allowed)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _unreadable(option, f"cannot read {str(path)!r}: {exc.strerror or exc}") from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _unreadable(
            option,
            f"{str(path)!r} is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start} ({exc.reason}); save the file as UTF-8",
        ) from exc


def checked(text: str, option: str) -> tuple[str, Any]:
    """``text`` and its value, if it is UTF-8 JSON that can be read; else ``InputUnreadable``
    (``cli.input_unreadable``) naming ``option``. Whether the value can be stored is the
    host's to say, with the flow's name (``flow.input_unstorable``)."""
    for index, char in enumerate(text):
        if ord(char) in _ESCAPED_BYTES:
            raise _unreadable(
                option,
                f"the value is not UTF-8: byte 0x{ord(char) - 0xDC00:02x} at character "
                f"{index}; pass UTF-8 text (check the terminal's or the script's encoding)",
            )
    try:
        value = codec.loads(text)
    except ValueError as exc:  # json.JSONDecodeError is one
        raise _unreadable(
            option,
            f"not valid JSON ({exc}); quote it for the shell, e.g. {option} '{{\"a\": 1}}'",
        ) from exc
    except RecursionError as exc:
        raise _unreadable(option, _TOO_DEEP) from exc
    if _depth(value) > MAX_NESTING:
        raise _unreadable(option, _TOO_DEEP)
    return text, value


#: The deepest JSON a flow's input or a signal's payload may nest: pydantic's JSON parser
#: refuses deeper (at about 200 levels), so deeper is a usage error, said the same way
#: however deep it goes.
MAX_NESTING: Final = 200
_TOO_DEEP: Final = f"the JSON nests too deeply (more than {MAX_NESTING} levels); flatten it"


def _depth(value: Any) -> int:
    """How many containers deep ``value`` nests (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, level = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            deepest = max(deepest, level)
            if level <= MAX_NESTING:  # no need to look further down
                stack.extend((item, level + 1) for item in v)
    return deepest


def _unreadable(option: str, detail: str) -> InputUnreadable:
    return InputUnreadable(f"{option}: {detail}")


def cursor(before: str) -> tuple[datetime, str]:
    """Parse ``CREATED_AT,ID`` as printed by the previous page.

    A timestamp without a zone is taken as UTC, the zone every store writes: a local-time
    reading would silently page from the wrong place.
    """
    stamp, sep, instance_id = before.partition(",")
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        moment = None
    if moment is None or not sep or not instance_id:
        raise click.BadParameter(
            f"{before!r} is not CREATED_AT,ID (copy it from the 'more:' line of the last page)",
            param_hint="--before",
        )
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        moment.astimezone(UTC)  # a stamp at the calendar's edge has no UTC form
    except OverflowError as exc:
        raise click.BadParameter(
            f"{before!r}: {stamp} is outside the dates a journal holds", param_hint="--before"
        ) from exc
    return moment, instance_id


def moment(text: str, option: str) -> datetime:
    """An ISO 8601 timestamp given to ``option`` (``--since``, ``--until``); one without a
    zone is UTC, the zone every store writes."""
    try:
        found = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not an ISO 8601 timestamp (e.g. 2026-12-01T00:00:00Z)",
            param_hint=option,
        ) from None
    if found.tzinfo is None:
        found = found.replace(tzinfo=UTC)
    try:
        return found.astimezone(UTC)
    except OverflowError as exc:
        raise click.BadParameter(
            f"{text!r} is outside the dates a journal holds", param_hint=option
        ) from exc


def name_or_fail(value: str | None, option: str) -> None:
    """A filter or key an option gives (a flow id, a version, a tenant) must be a name the
    journal can hold: a NUL or a control character is a usage error here, not a driver
    error later."""
    if value is None:
        return
    problem = name_problem(value)
    if problem is not None:
        raise click.BadParameter(f"{value!r} {problem}", param_hint=option)
