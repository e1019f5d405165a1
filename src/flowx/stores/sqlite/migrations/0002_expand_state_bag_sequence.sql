-- Expand: which commit the state-bag snapshot is of. Nullable, no default, so a node on the
-- previous release keeps inserting and updating instances without knowing it exists.
ALTER TABLE flow_instance ADD COLUMN state_bag_sequence INTEGER;

-- Backfill only instances that already carry a snapshot, from their last committed step.
UPDATE flow_instance
   SET state_bag_sequence = (SELECT max(s.sequence) FROM flow_step s
                              WHERE s.instance_id = flow_instance.instance_id)
 WHERE state_bag <> '{}' AND next_sequence > 1;
