-- Signals (R2.10) and replays. Expand only: two nullable columns and a new table, so the
-- previous release keeps writing and reading instances without knowing any of it exists.
--   wake_signal: the signal name a Suspended instance waits for ('flowx.sub_flow' for a
--     parent waiting on its child); a signal of that name makes it Pending in the same write.
--   replay_sequence: set by a replay to the instance's next_sequence, so failures journaled
--     before it no longer count against a retry budget. The history itself is never rewritten.
ALTER TABLE flow_instance ADD COLUMN wake_signal text;
ALTER TABLE flow_instance ADD COLUMN replay_sequence bigint;

-- An instance's inbox. A signal may arrive before the flow reaches its wait, so it is kept in
-- a row of its own, not on the instance; the run that takes it journals it as that step's own
-- flow_step row, which is what makes a redelivery inert (R2.10). seq is the global order of
-- arrival. payload is json, not jsonb, like every payload column: stored byte for byte.
-- The FK cascades: an inbox goes with its purged instance.
CREATE TABLE flow_signal (
    seq         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    instance_id uuid        NOT NULL REFERENCES flow_instance (instance_id) ON DELETE CASCADE,
    name        text        NOT NULL,
    key         text,                               -- the sender's dedup key; null = none
    payload     json        NOT NULL,
    received_at timestamptz NOT NULL
);
-- One signal per sender key: a redelivered send finds its first copy and writes nothing.
CREATE UNIQUE INDEX flow_signal_key_idx
    ON flow_signal (instance_id, name, key) WHERE key IS NOT NULL;
-- Serves the inbox read and the suspend check: one instance's signals of one name, by seq.
CREATE INDEX flow_signal_inbox_idx ON flow_signal (instance_id, name, seq);
