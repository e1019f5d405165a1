-- The outbox's global staging order. event_id is a random uuid and outbox_event.sequence is
-- instance-local, so neither can order a publisher's claim. Expand: a nullable column filled
-- by a sequence default; existing rows backfilled in the order they were staged.
CREATE SEQUENCE outbox_event_staged_seq;
ALTER TABLE outbox_event ADD COLUMN staged_seq bigint;
ALTER TABLE outbox_event ALTER COLUMN staged_seq SET DEFAULT nextval('outbox_event_staged_seq');
ALTER SEQUENCE outbox_event_staged_seq OWNED BY outbox_event.staged_seq;
UPDATE outbox_event o
   SET staged_seq = b.n
  FROM (SELECT event_id, nextval('outbox_event_staged_seq') AS n
          FROM (SELECT event_id FROM outbox_event ORDER BY staged_at, instance_id, sequence, ordinal) x) b
 WHERE b.event_id = o.event_id;
CREATE UNIQUE INDEX outbox_event_staged_seq_idx ON outbox_event (staged_seq);
-- Serves the publisher's claim: pending events in staging order.
CREATE INDEX outbox_event_pending_idx ON outbox_event (staged_seq) WHERE published_at IS NULL;
