-- The node that wrote each step row, for the step timeline an operator reads (`flowx show`):
-- which node ran an attempt, and where a takeover happened. Expand only: one nullable
-- column; rows written before it, and by the previous release, have none.
ALTER TABLE flow_step ADD COLUMN node_id text;
