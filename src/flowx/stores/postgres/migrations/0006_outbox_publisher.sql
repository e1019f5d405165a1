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

-- Change subscriptions (R2.14) read in an order that never lets an event appear behind a
-- cursor that has passed it. staged_seq cannot be that order: two transactions take their
-- values in one order and may commit in the other, and a cursor that passed the later value
-- would skip the earlier one for ever. The staging transaction's id can: a reader takes only
-- events of transactions older than every transaction still running
-- (pg_snapshot_xmin), and orders by (staged_xid, staged_seq); nothing can later commit below
-- that point. Expand: a nullable column whose default fills every new row (the previous
-- release's too); the rows already there are numbered 0, before everything.
ALTER TABLE outbox_event ADD COLUMN staged_xid xid8;
ALTER TABLE outbox_event ALTER COLUMN staged_xid SET DEFAULT pg_current_xact_id();
UPDATE outbox_event SET staged_xid = '0'::xid8 WHERE staged_xid IS NULL;
CREATE INDEX outbox_event_change_idx ON outbox_event (staged_xid, staged_seq);
ALTER TABLE change_cursor ADD COLUMN last_staged_xid xid8;
