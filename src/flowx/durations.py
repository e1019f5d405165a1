"""Durations as users write them: ``"30s"``, ``"1h"``, ``"2d"``, ``"500ms"``, a number of
seconds, or a ``timedelta``."""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")

DurationLike = str | int | float | timedelta


def parse_duration(value: DurationLike, *, what: str = "duration") -> timedelta:
    """Parse ``value``; raise ``ValueError`` naming ``what`` and the accepted forms."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError(f"{what} must be a duration, not a bool")
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _PATTERN.match(value)
        if match is None:
            raise ValueError(
                f"{what} {value!r} is not a duration; write e.g. '500ms', '30s', '5m', '1h', '2d'"
            )
        seconds = float(match[1]) * _UNITS[match[2]]
    else:
        raise ValueError(f"{what} must be a str, a number of seconds or a timedelta")
    if seconds < 0:
        raise ValueError(f"{what} must not be negative (got {value!r})")
    return timedelta(seconds=seconds)
