"""What FlowX accepts as a name: a flow id, a step, signal or capability name (FLOWX1026).

Names end up in journal rows, log lines, metrics labels and ``flowx show`` tables; a name
with a newline or a lone surrogate in it, or a name of a megabyte, would forge a log line or
fail at the driver, so it is refused where it is declared.
"""

from __future__ import annotations

import unicodedata
from typing import Final

#: The longest name FlowX accepts: plenty for ``order.payment.capture-v2``, short enough for
#: a table column, a log line and a metrics label.
MAX_NAME_LENGTH: Final = 200


def name_problem(value: object) -> str | None:
    """Why ``value`` cannot be a name, or ``None``."""
    if not isinstance(value, str):
        return f"must be a str, not {type(value).__name__}"
    if not value:
        return "must not be empty"
    if len(value) > MAX_NAME_LENGTH:
        return f"is {len(value)} characters long; the most is {MAX_NAME_LENGTH}"
    for index, char in enumerate(value):
        if unicodedata.category(char) in ("Cc", "Cs", "Zl", "Zp"):
            return (
                f"holds {char!r} at index {index}: names may not hold control characters, "
                "line breaks or lone surrogates"
            )
    return None


def shown(value: object) -> str:
    """A name for a message: its repr, clipped to one short line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
