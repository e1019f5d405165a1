-- The outbox publisher (R5.2, R5.3, R5.5). Expand only: nullable columns and new indexes, so
-- the previous release keeps staging events without knowing any of them exists.
--   attempts / last_error: refusals counted under the publisher's retry policy;
--   dead_at / dead_reason: an event moved aside after that policy ran out (a dead letter).
-- A dead letter keeps its row: a change subscription that has not read it still will.
ALTER TABLE outbox_event ADD COLUMN attempts integer;
ALTER TABLE outbox_event ADD COLUMN last_error text;
ALTER TABLE outbox_event ADD COLUMN dead_at timestamptz;
ALTER TABLE outbox_event ADD COLUMN dead_reason text;

-- Serves the claim's sibling hold: "does this key have an older pending event?" is one index
-- probe per claimed row, not a scan.
CREATE INDEX outbox_event_pending_key_idx
    ON outbox_event (partition_key, staged_seq) WHERE published_at IS NULL;
-- The operator's dead-letter list.
CREATE INDEX outbox_event_dead_idx ON outbox_event (dead_at) WHERE dead_at IS NOT NULL;
