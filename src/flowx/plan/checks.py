"""Checks of what an author passes to the builder, apart from the plan's shape (R2.12).

Names end up in journal rows, log lines, metrics labels and ``flowx show`` tables, and
retry policies in delay arithmetic, so a name with a newline in it, a name of a megabyte, or
``Retry(attempts=float("nan"))`` must be refused when the plan is built, with a ``FLOWX``
code, instead of surfacing later as a driver error, a forged log line or an
``OverflowError`` in the middle of a running flow:

* ``FLOWX1026``: a name (flow, step, signal, capability) that is not a str, is empty, is
  longer than ``MAX_NAME_LENGTH`` or holds a control character;
* ``FLOWX1027``: a retry policy whose arguments are out of range.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any, Final

from flowx.durations import parse_duration
from flowx.errors import PlanError
from flowx.names import MAX_NAME_LENGTH, name_problem, shown

#: The most attempts a retry policy may ask for; beyond it a step would retry for ever.
MAX_ATTEMPTS: Final = 10_000
#: The largest backoff multiplier; the delay is capped by ``maximum`` anyway.
MAX_MULTIPLIER: Final = 1_000.0
BACKOFFS: Final = ("exponential", "fixed", "none")

BAD_NAME: Final = "FLOWX1026"
BAD_RETRY: Final = "FLOWX1027"


class PlanArgumentError(PlanError, ValueError):
    """A builder argument out of range (``FLOWX1026`` / ``FLOWX1027``).

    Also a ``ValueError``: ``Retry(attempts=0)`` raised one before these codes existed, and
    callers that catch it keep working.
    """


def check_name(value: object, what: str, flow_id: str | None = None) -> None:
    """Raise ``FLOWX1026`` if ``value`` cannot be a name; ``what`` says whose it is."""
    problem = name_problem(value)
    if problem is not None:
        where = f"flow {shown(flow_id)}: " if flow_id is not None else ""
        raise PlanArgumentError(
            BAD_NAME,
            f"{where}{what} {shown(value)} {problem}; use a short printable name such as "
            "'reserve-stock'",
            flow_id=flow_id if isinstance(flow_id, str) else None,
        )


def check_retry(
    *,
    attempts: object,
    backoff: object,
    initial: Any,
    maximum: Any,
    multiplier: object,
    where: str = "Retry",
) -> None:
    """Raise ``FLOWX1027`` naming the first argument of a retry policy that is out of range."""

    def bad(message: str) -> PlanArgumentError:
        return PlanArgumentError(BAD_RETRY, f"{where}: {message}")

    if isinstance(attempts, bool) or not isinstance(attempts, int):
        raise bad(f"attempts={shown(attempts)} must be an int (every try, the first included)")
    if not 1 <= attempts <= MAX_ATTEMPTS:
        raise bad(f"attempts={attempts} counts the first try: it must be from 1 to {MAX_ATTEMPTS}")
    if backoff not in BACKOFFS:
        raise bad(f"backoff={shown(backoff)} must be one of {', '.join(map(repr, BACKOFFS))}")
    if (
        isinstance(multiplier, bool)
        or not isinstance(multiplier, int | float)
        or not math.isfinite(multiplier)
        or not 1 <= multiplier <= MAX_MULTIPLIER
    ):
        raise bad(f"multiplier={shown(multiplier)} must be a number from 1 to {MAX_MULTIPLIER:g}")
    for label, value in (("initial", initial), ("maximum", maximum)):
        try:
            parse_duration(value, what=f"{label}=")
        except ValueError as exc:
            raise bad(str(exc)) from exc


def capped_delay(initial: timedelta, cap: timedelta, multiplier: float, failures: int) -> float:
    """``initial * multiplier ** (failures - 1)`` seconds, at most ``cap``, without the
    ``OverflowError`` the power raises after enough failures."""
    first, most = initial.total_seconds(), cap.total_seconds()
    try:
        return float(min(first * multiplier ** max(failures - 1, 0), most))
    except OverflowError:
        return most


__all__ = [
    "BAD_NAME",
    "BAD_RETRY",
    "MAX_NAME_LENGTH",
    "PlanArgumentError",
    "capped_delay",
    "check_name",
    "check_retry",
    "name_problem",
]
