-- Retention (R2.13). Expand only: one index. The sweep reads ended instances oldest first by
-- the time they were last written, a page at a time, keyset-paged by (updated_at,
-- instance_id); the index holds only ended rows, so a journal of live work pays nothing for it.
CREATE INDEX flow_instance_ended_idx ON flow_instance (updated_at, instance_id)
    WHERE state IN ('Completed', 'Failed', 'TimedOut', 'CompensationFailed', 'Cancelled',
                    'Terminated');
