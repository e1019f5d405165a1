-- Signals (R2.10) and replays. Expand only: two nullable columns and a new table, so the
-- previous release keeps writing and reading instances without knowing any of it exists.
--   wake_signal: the signal name a Suspended instance waits for ('flowx.sub_flow' for a
--     parent waiting on its child); a signal of that name makes it Pending in the same write.
--   replay_sequence: set by a replay to the instance's next_sequence, so failures journaled
--     before it no longer count against a retry budget. The history itself is never rewritten.
ALTER TABLE flow_instance ADD COLUMN wake_signal TEXT;
ALTER TABLE flow_instance ADD COLUMN replay_sequence INTEGER;

-- An instance's inbox (same shape and meaning as on PostgreSQL). seq is the order of arrival;
-- AUTOINCREMENT so a number is never reused, even after the newest row is purged.
CREATE TABLE flow_signal (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    instance_id TEXT    NOT NULL REFERENCES flow_instance (instance_id) ON DELETE CASCADE,
    name        TEXT    NOT NULL,
    key         TEXT,                                -- the sender's dedup key; null = none
    payload     TEXT    NOT NULL,                    -- json, exactly as sent
    received_at TEXT    NOT NULL
);
-- One signal per sender key: a redelivered send finds its first copy and writes nothing.
CREATE UNIQUE INDEX flow_signal_key_idx
    ON flow_signal (instance_id, name, key) WHERE key IS NOT NULL;
-- Serves the inbox read and the suspend check: one instance's signals of one name, by seq.
CREATE INDEX flow_signal_inbox_idx ON flow_signal (instance_id, name, seq);
