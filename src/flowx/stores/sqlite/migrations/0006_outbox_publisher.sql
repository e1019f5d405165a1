-- The outbox publisher (R5.2, R5.3, R5.5). SQLite has no row locks, so a claim is a short
-- write that stamps the rows it takes (claimed_by, claim_until); the broker is called outside
-- any transaction, and a second short write marks what it acknowledged. A claim whose
-- publisher died runs out at claim_until. Expand only: nullable columns and new indexes.
ALTER TABLE outbox_event ADD COLUMN attempts INTEGER;
ALTER TABLE outbox_event ADD COLUMN last_error TEXT;
ALTER TABLE outbox_event ADD COLUMN dead_at TEXT;
ALTER TABLE outbox_event ADD COLUMN dead_reason TEXT;
ALTER TABLE outbox_event ADD COLUMN claimed_by TEXT;
ALTER TABLE outbox_event ADD COLUMN claim_until TEXT;

CREATE INDEX outbox_event_pending_key_idx
    ON outbox_event (partition_key, staged_seq) WHERE published_at IS NULL;
CREATE INDEX outbox_event_dead_idx ON outbox_event (dead_at) WHERE dead_at IS NOT NULL;
