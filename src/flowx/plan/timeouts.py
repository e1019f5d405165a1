"""Step timeouts as the plan builder accepts them (issue 12 item 4).

A step's ``timeout=`` (or the flow's ``step_timeout=`` default) bounds one attempt of its
capability. It is checked here, at build time, so a typo or a nonsense bound (zero, negative,
weeks long) surfaces when the flow is registered, with the step's name, never when an instance
first reaches the step (R2.12).
"""

from __future__ import annotations

from datetime import timedelta

from flowx.durations import DurationLike, parse_duration

#: Diagnostic code of an invalid step timeout (see ``flowx.plan.diagnostics``).
STEP_TIMEOUT_INVALID = "FLOWX1025"
#: Longer than this is a mistake, not a bound: an attempt held for a week holds its lease,
#: a worker slot and (for a sync capability) a thread all that time.
MAX_STEP_TIMEOUT = timedelta(days=7)


def step_timeout(value: DurationLike | None, *, where: str) -> timedelta | None:
    """``value`` as a timedelta, or ``None`` for no bound; ``ValueError`` naming ``where``."""
    if value is None:
        return None
    try:
        parsed = parse_duration(value, what=f"{where}: timeout")
    except (ValueError, OverflowError) as exc:
        message = (
            str(exc) if isinstance(exc, ValueError) else f"{where}: timeout {value!r} is too large"
        )
        raise ValueError(message) from exc
    if parsed <= timedelta(0):
        raise ValueError(f"{where}: timeout must be positive (got {value!r}); omit it for no bound")
    if parsed > MAX_STEP_TIMEOUT:
        raise ValueError(
            f"{where}: timeout {value!r} is longer than 7 days; an attempt that long holds its "
            "lease and a worker slot all that time — use a shorter bound, or none"
        )
    return parsed
