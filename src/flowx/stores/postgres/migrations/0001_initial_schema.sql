-- FlowX journal, PostgreSQL (SPEC.md R2.1). Payload columns are json, not jsonb: json keeps
-- the text exactly as written (key order, spacing, repeated keys); jsonb would re-render it.
-- Later changes arrive as later migrations, each additive (R7.4).

CREATE TABLE flow_instance (
    instance_id        uuid        PRIMARY KEY,
    flow_id            text        NOT NULL,
    flow_version       text        NOT NULL,
    tenant_id          text,                        -- the partition key (R2.7)
    state              text        NOT NULL CHECK (state IN ('Pending', 'Running', 'Suspended',
                           'Compensating', 'Completed', 'Failed', 'TimedOut', 'CompensationFailed')),
    fence              bigint      NOT NULL DEFAULT 0,  -- highest token shown; below it a write is refused
    next_sequence      bigint      NOT NULL DEFAULT 1,  -- allocator for flow_step.sequence
    resume_from_step   integer,                     -- operator hint only; the engine never reads it
    input              json        NOT NULL,        -- immutable
    state_bag          json        NOT NULL,        -- last checkpoint
    error              json,                        -- why a terminal failure happened
    idempotency_key    text,
    parent_instance_id uuid,                        -- sub-flow child; no FK, an orphan stays legible
    parent_scope       text,
    parent_step_id     integer,
    correlation_id     text,
    trace_id           text,
    deadline_at        timestamptz,
    resume_count       integer     NOT NULL DEFAULT 0,  -- takeovers since the last step commit
    codec_version      integer     NOT NULL DEFAULT 1,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    version            bigint      NOT NULL DEFAULT 0   -- optimistic lock
);

CREATE UNIQUE INDEX flow_instance_idempotency_idx
    ON flow_instance (flow_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX flow_instance_tenant_state_idx ON flow_instance (tenant_id, state);
-- Serves `flowx list`: newest first, keyset paged.
CREATE INDEX flow_instance_created_idx ON flow_instance (created_at, instance_id);

CREATE TABLE flow_step (
    instance_id        uuid        NOT NULL REFERENCES flow_instance (instance_id) ON DELETE CASCADE,
    scope              text        NOT NULL,        -- '' the body, '7' the eighth for_each element, '7/2' nested
    step_id            integer     NOT NULL,
    attempt            integer     NOT NULL,
    sequence           bigint      NOT NULL,        -- instance-local commit order
    step_name          text        NOT NULL,
    capability_id      text,
    capability_version text,                        -- resolved and pinned (R2.6)
    outcome            text        NOT NULL CHECK (outcome IN ('Success', 'Failure', 'Compensated',
                           'CompensationFailure')),
    result             json        NOT NULL,        -- the value, or the error
    nondeterministic   json,                        -- clock, ids, randomness captured (R2.5)
    duration_ms        bigint      NOT NULL,        -- bigint: an int overflows at 24.8 days
    committed_at       timestamptz NOT NULL,
    PRIMARY KEY (instance_id, scope, step_id, attempt),
    CONSTRAINT flow_step_sequence_key UNIQUE (instance_id, sequence)
);

-- R2.2: the history is the truth. A row is inserted once and never changed.
CREATE FUNCTION flow_step_refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'flow_step is append-only: rows are inserted, never updated'
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$;
CREATE TRIGGER flow_step_append_only BEFORE UPDATE ON flow_step
    FOR EACH ROW EXECUTE FUNCTION flow_step_refuse_update();

CREATE TABLE outbox_event (
    event_id       uuid        PRIMARY KEY,
    instance_id    uuid        NOT NULL REFERENCES flow_instance (instance_id) ON DELETE CASCADE,
    sequence       bigint      NOT NULL,            -- the step commit that staged it
    ordinal        integer     NOT NULL,            -- position within that commit
    type           text        NOT NULL,
    schema_version text        NOT NULL,
    partition_key  text,
    payload        json        NOT NULL,
    staged_at      timestamptz NOT NULL,
    published_at   timestamptz                      -- null = pending
);
CREATE INDEX outbox_event_instance_idx ON outbox_event (instance_id, sequence, ordinal);

-- No FK to flow_instance, deliberately: a lease is taken before its instance exists.
-- Never deleted: release and expiry update expires_at, so tokens never restart (R3.1).
CREATE TABLE flow_lease (
    instance_id   uuid        PRIMARY KEY,
    owner_node    text        NOT NULL,
    fencing_token bigint      NOT NULL,
    expires_at    timestamptz NOT NULL,
    acquired_at   timestamptz NOT NULL
);

CREATE TABLE retention_policy (
    flow_id     text     NOT NULL,                  -- '*' is the default
    state_class text     NOT NULL CHECK (state_class IN ('Completed', 'Failed', 'Suspended',
                    'OutboxPublished')),
    retain_for  interval,                           -- null = not on a timer
    PRIMARY KEY (flow_id, state_class)
);
INSERT INTO retention_policy (flow_id, state_class, retain_for) VALUES
    ('*', 'Completed', interval '30 days'),
    ('*', 'Failed', interval '180 days'),           -- covers TimedOut and CompensationFailed
    ('*', 'Suspended', NULL),                       -- never on a timer
    ('*', 'OutboxPublished', interval '7 days');

CREATE TABLE change_cursor (
    consumer        text        PRIMARY KEY,
    last_staged_seq bigint      NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL
);
