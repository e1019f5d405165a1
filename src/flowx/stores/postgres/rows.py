"""Reading PostgreSQL rows into records: what the journal, the recovery index and the waits
all read, kept apart from each of them so none imports another for it.

A ``dict_row`` cursor hands back rows keyed by column name, already typed (``timestamptz`` as
``datetime``), which is exactly what the backend-neutral readers in ``flowx.stores.columns``
take.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, LiteralString

from psycopg.rows import dict_row

from flowx.stores.columns import candidate_of
from flowx.stores.postgres.database import PostgresDatabase
from flowx.stores.records import RecoveryCandidate


async def candidates(
    db: PostgresDatabase, query: LiteralString, args: tuple[Any, ...]
) -> Sequence[RecoveryCandidate]:
    """Run a candidate query (the recovery scan's, the timer's) and read its rows."""
    async with db.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        rows = await (await cur.execute(query, args)).fetchall()
    return tuple(candidate_of(r) for r in rows)
