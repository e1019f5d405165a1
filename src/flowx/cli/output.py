"""Plain aligned tables and JSON: what ``-o text`` and ``-o json`` print."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, default=str, indent=2, sort_keys=True))


def clip(text: str | None, width: int = 60) -> str:
    if text is None:
        return ""
    return text if len(text) <= width else text[: width - 1] + "…"
