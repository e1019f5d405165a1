"""Plain aligned tables and JSON: what ``-o text`` and ``-o json`` print.

Hand-written rather than a table library so the bare install (``pydantic`` and ``click``) can
print everything; operators on a minimal container still get readable output.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns under a dashed rule, two spaces apart.

    Trailing spaces are stripped so that the output diffs and greps cleanly; ``None`` prints as
    an empty cell rather than the word ``None``.
    """
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def emit_json(value: Any) -> None:
    """Print one JSON document. ``default=str`` turns datetimes into text instead of failing."""
    click.echo(json.dumps(value, default=str, indent=2, sort_keys=True))


def clip(text: str | None, width: int = 60) -> str:
    """Shorten ``text`` to ``width`` characters, ending in ``…`` when something was cut.

    A step result can be megabytes of JSON; one table row must stay one terminal line. The full
    value is always available with ``-o json``.
    """
    if text is None:
        return ""
    text = " ".join(text.splitlines())
    return text if len(text) <= width else text[: width - 1] + "…"
