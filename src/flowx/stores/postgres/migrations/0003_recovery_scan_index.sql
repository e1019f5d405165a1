-- The recovery scan (R3.4) reads idle active instances oldest first. A partial index in
-- updated_at order serves `... WHERE state IN (...) AND updated_at < $1 ORDER BY updated_at
-- LIMIT n` as a range scan with no sort. Queued (Pending) instances get their own index, so
-- a worker finds them without walking every running instance.
CREATE INDEX flow_instance_abandoned_idx
    ON flow_instance (updated_at, instance_id) WHERE state IN ('Pending', 'Running', 'Compensating');
CREATE INDEX flow_instance_queued_idx
    ON flow_instance (updated_at, instance_id) WHERE state = 'Pending';
