-- The recovery scan (R3.4) reads idle active instances oldest first: a partial index in
-- updated_at order serves it with no sort. Queued (Pending) instances get their own, so a
-- worker finds them without walking every running instance.
CREATE INDEX flow_instance_abandoned_idx
    ON flow_instance (updated_at, instance_id) WHERE state IN ('Pending', 'Running', 'Compensating');
CREATE INDEX flow_instance_queued_idx
    ON flow_instance (updated_at, instance_id) WHERE state = 'Pending';
