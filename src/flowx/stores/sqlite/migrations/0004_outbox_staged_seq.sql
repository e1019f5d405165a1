-- The outbox's global staging order. In SQLite it has been the AUTOINCREMENT rowid
-- (staged_seq) since 0001, so this migration only adds the index the publisher's claim reads:
-- pending events in staging order.
CREATE INDEX outbox_event_pending_idx ON outbox_event (staged_seq) WHERE published_at IS NULL;
