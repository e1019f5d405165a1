-- A signal by correlation id (issue 18; R6.1). Expand only: one index. The ingress and
-- `flowx signal --correlation` find the instances that carry a correlation id, newest first,
-- through the instance list's correlation filter; a correlation id is not unique (a sub-flow
-- child inherits its parent's), so the index is not either. Partial: most instances carry no
-- correlation id and pay nothing for it. A plain CREATE INDEX: the migration runner applies
-- each file inside one transaction, where CREATE INDEX CONCURRENTLY is refused.
CREATE INDEX flow_instance_correlation_idx ON flow_instance (correlation_id, created_at, instance_id)
    WHERE correlation_id IS NOT NULL;
