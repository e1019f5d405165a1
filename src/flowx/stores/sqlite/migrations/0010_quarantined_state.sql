-- Quarantine (same meaning as on PostgreSQL): the state CHECK widened by 'Quarantined', the
-- table definition edited in place as in 0008 (no stored byte changes; the runner refuses an
-- edit that does not match exactly one definition, and bumps the schema cookie).
PRAGMA writable_schema = ON;
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (state IN (''Pending'', ''Running'', ''Suspended'',
                           ''Compensating'', ''Completed'', ''Failed'', ''TimedOut'', ''CompensationFailed'',
                           ''Cancelled'', ''Terminated''))',
    'CHECK (state IN (''Pending'', ''Running'', ''Suspended'',
                           ''Compensating'', ''Completed'', ''Failed'', ''TimedOut'', ''CompensationFailed'',
                           ''Cancelled'', ''Terminated'', ''Quarantined''))')
 WHERE type = 'table' AND name = 'flow_instance'
   AND instr(sql,
    'CHECK (state IN (''Pending'', ''Running'', ''Suspended'',
                           ''Compensating'', ''Completed'', ''Failed'', ''TimedOut'', ''CompensationFailed'',
                           ''Cancelled'', ''Terminated''))') > 0;
PRAGMA writable_schema = OFF;
