"""Durations as users write them: ``"30s"``, ``"1h"``, ``"2d"``, ``"500ms"``, ``"1h30m"``
(units largest first, each once), a number of seconds (``90`` or ``"90"``), or a
``timedelta``.

Every duration is bounded: at most ``MAX_DURATION`` (100 years), never negative, never NaN
or infinite. Without the bound a typo (``--lease-ttl 99999999999d``) would surface as an
``OverflowError`` from ``timedelta`` or, later, from date arithmetic in the middle of a
running flow; with it the setting is named at the door.
"""

from __future__ import annotations

import itertools
import math
import re
from datetime import timedelta
from typing import Final

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_COMPOUND = re.compile(r"\s*(?:\d+(?:\.\d+)?\s*(?:ms|s|m|h|d)\s*)+")
_SECONDS = re.compile(r"\s*\d+(?:\.\d+)?\s*")


def _text_seconds(value: str, what: str) -> float:
    """Seconds in ``value``: a plain number, or unit parts largest first (``1h30m``)."""
    if _SECONDS.fullmatch(value):
        return float(value)
    parts = _PART.findall(value) if _COMPOUND.fullmatch(value) else []
    sizes = [_UNITS[unit] for _, unit in parts]
    if not parts or any(a <= b for a, b in itertools.pairwise(sizes)):
        raise ValueError(
            f"{what} {_shown(value)} is not a duration; "
            "write e.g. '500ms', '30s', '90', '5m', '1h30m', '2d'"
        )
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


#: The longest duration FlowX accepts anywhere: 36,500 days (about 100 years). Far beyond any
#: real timeout, and far enough below ``datetime.max`` that ``now + duration`` cannot overflow.
MAX_DURATION: Final = timedelta(days=36_500)

DurationLike = str | int | float | timedelta


def parse_duration(value: DurationLike, *, what: str = "duration") -> timedelta:
    """Parse ``value``; raise ``ValueError`` naming ``what`` and the accepted forms."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError(f"{what} must be a duration, not a bool")
    elif isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int too large for a float
            seconds = math.inf
    elif isinstance(value, str):
        seconds = _text_seconds(value, what)
    else:
        raise ValueError(f"{what} must be a str, a number of seconds or a timedelta")
    if not math.isfinite(seconds) and not (isinstance(value, int) and seconds > 0):
        raise ValueError(f"{what} must be a finite number of seconds (got {_shown(value)})")
    if seconds < 0:
        raise ValueError(f"{what} must not be negative (got {_shown(value)})")
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(
            f"{what} {_shown(value)} is longer than the longest duration FlowX accepts "
            f"({MAX_DURATION.days} days)"
        )
    return timedelta(seconds=seconds)


def _shown(value: object) -> str:
    """``value`` for a message: its repr, clipped so a megabyte argument stays one line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
