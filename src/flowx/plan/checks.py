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
from typing import Any, Final, Protocol

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
        raise bad(
            f"attempts={attempts} counts the first try: it must be from 1 to {MAX_ATTEMPTS}"
        )
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


class _Draft(Protocol):
    kind: str
    name: str | None
    args: dict[str, Any]
    bodies: list[list[Any]]


def check_drafts(flow_id: object, version: object, drafts: list[Any]) -> None:
    """Check a flow's id, version and every node's name and retry policy before the plan is
    compiled, so a bad argument is named rather than met as a ``TypeError`` there."""
    check_name(flow_id, "the flow id")
    if not isinstance(version, str) or name_problem(version) is not None:
        raise PlanArgumentError(
            "FLOWX1014",
            f"flow {shown(flow_id)}: version {shown(version)} must look like '1', '1.2' or "
            "'1.2.3'",
            flow_id=str(flow_id),
        )
    _walk(str(flow_id), drafts)


def _walk(flow_id: str, drafts: list[_Draft]) -> None:
    from flowx.plan.model import Retry  # model imports this module

    for d in drafts:
        a = d.args
        if d.kind == "await_signal":
            signal = a["signal"]
            if isinstance(signal, str) and signal:  # FLOWX1023 covers the rest
                check_name(signal, "signal name", flow_id)
            if d.name is not signal:
                check_name(d.name, f"await_signal {shown(signal)} name=", flow_id)
        elif d.name is not None or d.kind in ("for_each", "fork"):
            check_name(d.name, f"{d.kind} name=", flow_id)
        for key in ("retry", "compensate_retry"):
            policy = a.get(key)
            if policy is not None and not isinstance(policy, Retry):
                raise PlanArgumentError(
                    BAD_RETRY,
                    f"flow {shown(flow_id)}: {d.kind} {shown(d.name)} has {key}="
                    f"{shown(policy)}; pass flowx.Retry(attempts=..., ...)",
                    flow_id=flow_id,
                )
        for body in d.bodies:
            _walk(flow_id, body)


__all__ = [
    "BAD_NAME",
    "BAD_RETRY",
    "MAX_NAME_LENGTH",
    "PlanArgumentError",
    "capped_delay",
    "check_drafts",
    "check_name",
    "check_retry",
    "name_problem",
]
