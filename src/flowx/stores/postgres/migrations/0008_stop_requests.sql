-- Cancel and terminate (R9.4). Expand only: a nullable column, and two more values the
-- state CHECK accepts. Every row the old constraint accepted the new one accepts, so a node of
-- the previous release keeps writing and reading instances; only its `flowx list` cannot
-- name the two new states.
--   stop_request: an operator's cancel or terminate (mode, reason, who, when), kept on the
--     instance so the node running it learns of it in a read it makes anyway; the request
--     is also journaled as a row of the instance's inbox (flow_signal, name 'flowx.stop').
--   The CHECK is replaced by a wider one of the same name (a widening, not a contract: the
--   migration check verifies the new list holds every old value). NOT VALID skips a scan of
--   the table under its lock: no row can fail a list wider than the one it passed. (It is not
--   validated afterwards: migrations run in one transaction, so a VALIDATE here would scan
--   under the same exclusive lock after all.) New and updated rows are checked as always.
ALTER TABLE flow_instance ADD COLUMN stop_request json;
ALTER TABLE flow_instance
    DROP CONSTRAINT flow_instance_state_check,
    ADD CONSTRAINT flow_instance_state_check CHECK (state IN ('Pending', 'Running', 'Suspended',
        'Compensating', 'Completed', 'Failed', 'TimedOut', 'CompensationFailed', 'Cancelled',
        'Terminated')) NOT VALID;

-- A stop reaches an instance's sub-flow children, and theirs: found by parent, through this
-- index (only children have a parent, so it holds only their rows).
CREATE INDEX flow_instance_parent_idx ON flow_instance (parent_instance_id)
    WHERE parent_instance_id IS NOT NULL;
