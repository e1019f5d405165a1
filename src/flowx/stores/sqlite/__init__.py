"""The embedded default store: one SQLite file as journal, lease store and recovery index.

Safe for several worker *processes* on one machine (R1.2): WAL journal, ``BEGIN IMMEDIATE`` for
every write so writers queue on the file lock instead of failing on upgrade, and a busy timeout.
"""

from flowx.stores.sqlite.store import SqliteStores

__all__ = ["SqliteStores"]
