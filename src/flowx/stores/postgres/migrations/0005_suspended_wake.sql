-- A wait is a property of the waiting instance: parking it and scheduling its wake are one
-- write (R2.11). Nullable columns, so the previous release is untouched.
ALTER TABLE flow_instance ADD COLUMN wake_at timestamptz;
ALTER TABLE flow_instance ADD COLUMN wake_step_id integer;
ALTER TABLE flow_instance ADD COLUMN wake_scope text;

-- Serves the timer waker: only Suspended rows, by wake time.
CREATE INDEX flow_instance_wake_idx ON flow_instance (wake_at) WHERE state = 'Suspended';
