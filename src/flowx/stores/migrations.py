"""Numbered SQL migration files shipped inside a backend package.

Files are named ``NNNN_what_it_does.sql``; the number is the schema version. The same numbers
mean the same change in every SQL backend (SQLite and PostgreSQL), so one version number
describes a journal whatever it is stored in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def load(package: str) -> tuple[Migration, ...]:
    """Every migration in ``package``'s ``migrations`` folder, in version order, gap-free."""
    folder = resources.files(package) / "migrations"
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match is None:
            continue
        found.append(Migration(version=int(match[1]), name=match[2], sql=entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise RuntimeError(
                f"migrations of {package} are not numbered 1..N without gaps: "
                f"found {migration.version} where {expected} was expected"
            )
    return tuple(found)
