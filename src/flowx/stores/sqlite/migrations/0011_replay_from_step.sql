-- Replay from any step (R9.6). Expand only: one nullable column, so the previous release keeps
-- reading and writing instances without knowing it exists.
--   replay_from: set by a replay that re-runs forward from a chosen step; together with
--     replay_sequence it says which journal rows the run no longer counts: those of that step
--     and every later one, journaled before the replay. Null for any other replay (the rows
--     then count as they always did). resume_from_step stays what it was: the operator's hint.
ALTER TABLE flow_instance ADD COLUMN replay_from INTEGER;
