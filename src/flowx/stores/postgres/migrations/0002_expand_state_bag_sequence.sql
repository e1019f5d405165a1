-- Expand: which commit the state-bag snapshot is of. Nullable, no default, so a node on the
-- previous release keeps inserting and updating instances without knowing it exists.
ALTER TABLE flow_instance ADD COLUMN state_bag_sequence bigint;

-- Backfill only instances that already carry a snapshot, from their last committed step.
UPDATE flow_instance f
   SET state_bag_sequence = s.last
  FROM (SELECT instance_id, max(sequence) AS last FROM flow_step GROUP BY instance_id) s
 WHERE s.instance_id = f.instance_id AND f.state_bag::text <> '{}';
