-- Quarantine: an instance whose journal no longer matches its plan (the plan changed under
-- the same version) is set aside as 'Quarantined', with the reason as its error, instead of
-- being retried and logged on every recovery sweep. Not ended (retention keeps it) and not
-- active (recovery passes it by); `flowx replay` puts it back once the right code runs.
-- Expand only: the state CHECK widened by one value, as in 0008 (NOT VALID, for the same
-- reason: no row can fail a wider list, so none is scanned under the lock).
ALTER TABLE flow_instance
    DROP CONSTRAINT flow_instance_state_check,
    ADD CONSTRAINT flow_instance_state_check CHECK (state IN ('Pending', 'Running', 'Suspended',
        'Compensating', 'Completed', 'Failed', 'TimedOut', 'CompensationFailed', 'Cancelled',
        'Terminated', 'Quarantined')) NOT VALID;
