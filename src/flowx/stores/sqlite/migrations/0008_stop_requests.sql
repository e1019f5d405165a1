-- Cancel and terminate (R9.4). Expand only: a nullable column, and two more values the
-- state CHECK accepts (same meaning as on PostgreSQL).
ALTER TABLE flow_instance ADD COLUMN stop_request TEXT;  -- json, exactly as written

-- SQLite cannot alter a CHECK constraint. A wider one changes no stored byte (every row the
-- old list accepted the new one accepts), so the table's definition is edited in place, as
-- SQLite documents for such changes, instead of copying the table. The migration runner
-- refuses the edit unless it changed exactly one definition, and bumps the schema cookie so
-- every connection re-reads it. The migration check verifies the new list holds every old
-- value.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (state IN (''Pending'', ''Running'', ''Suspended'',
                           ''Compensating'', ''Completed'', ''Failed'', ''TimedOut'', ''CompensationFailed''))',
    'CHECK (state IN (''Pending'', ''Running'', ''Suspended'',
                           ''Compensating'', ''Completed'', ''Failed'', ''TimedOut'', ''CompensationFailed'',
                           ''Cancelled'', ''Terminated''))')
 WHERE type = 'table' AND name = 'flow_instance'
   AND instr(sql,
    'CHECK (state IN (''Pending'', ''Running'', ''Suspended'',
                           ''Compensating'', ''Completed'', ''Failed'', ''TimedOut'', ''CompensationFailed''))') > 0;
PRAGMA writable_schema = OFF;

-- A stop reaches an instance's sub-flow children, and theirs: found by parent, through this
-- index (only children have a parent, so it holds only their rows).
CREATE INDEX flow_instance_parent_idx ON flow_instance (parent_instance_id)
    WHERE parent_instance_id IS NOT NULL;
