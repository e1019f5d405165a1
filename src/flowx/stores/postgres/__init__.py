"""The production store: PostgreSQL as journal, lease store and recovery index (psycopg 3)."""

from flowx.stores.postgres.store import PostgresStores

__all__ = ["PostgresStores"]
