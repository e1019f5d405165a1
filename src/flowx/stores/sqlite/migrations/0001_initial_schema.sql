-- FlowX journal, SQLite edition. Same tables, columns and meaning as the PostgreSQL schema
-- (SPEC.md R2.1); types are SQLite's. Payload columns hold the canonical JSON text exactly as
-- written. Timestamps are ISO-8601 UTC text of fixed width, so they sort as they compare.

CREATE TABLE flow_instance (
    instance_id        TEXT    PRIMARY KEY,
    flow_id            TEXT    NOT NULL,
    flow_version       TEXT    NOT NULL,
    tenant_id          TEXT,
    state              TEXT    NOT NULL CHECK (state IN ('Pending', 'Running', 'Suspended',
                           'Compensating', 'Completed', 'Failed', 'TimedOut', 'CompensationFailed')),
    fence              INTEGER NOT NULL DEFAULT 0,   -- highest token shown; below it a write is refused
    next_sequence      INTEGER NOT NULL DEFAULT 1,   -- allocator for flow_step.sequence
    resume_from_step   INTEGER,                      -- operator hint only; the engine never reads it
    input              TEXT    NOT NULL,             -- json, immutable
    state_bag          TEXT    NOT NULL,             -- json, last checkpoint
    error              TEXT,                         -- json, why a terminal failure happened
    idempotency_key    TEXT,
    parent_instance_id TEXT,                         -- sub-flow child; no FK, an orphan stays legible
    parent_scope       TEXT,
    parent_step_id     INTEGER,
    correlation_id     TEXT,
    trace_id           TEXT,
    deadline_at        TEXT,
    resume_count       INTEGER NOT NULL DEFAULT 0,   -- takeovers since the last step commit
    codec_version      INTEGER NOT NULL DEFAULT 1,
    created_at         TEXT    NOT NULL,
    updated_at         TEXT    NOT NULL,
    version            INTEGER NOT NULL DEFAULT 0
);

CREATE UNIQUE INDEX flow_instance_idempotency_idx
    ON flow_instance (flow_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX flow_instance_tenant_state_idx ON flow_instance (tenant_id, state);
-- Serves `flowx list`: newest first, keyset paged.
CREATE INDEX flow_instance_created_idx ON flow_instance (created_at, instance_id);

CREATE TABLE flow_step (
    instance_id        TEXT    NOT NULL REFERENCES flow_instance (instance_id) ON DELETE CASCADE,
    scope              TEXT    NOT NULL,             -- '' the body, '7' the eighth for_each element, '7/2' nested
    step_id            INTEGER NOT NULL,
    attempt            INTEGER NOT NULL,
    sequence           INTEGER NOT NULL,             -- instance-local commit order
    step_name          TEXT    NOT NULL,
    capability_id      TEXT,
    capability_version TEXT,                         -- resolved and pinned (R2.6)
    outcome            TEXT    NOT NULL CHECK (outcome IN ('Success', 'Failure', 'Compensated',
                           'CompensationFailure')),
    result             TEXT    NOT NULL,             -- json: the value, or the error
    nondeterministic   TEXT,                         -- json: clock, ids, randomness captured (R2.5)
    duration_ms        INTEGER NOT NULL,
    committed_at       TEXT    NOT NULL,
    PRIMARY KEY (instance_id, scope, step_id, attempt),
    UNIQUE (instance_id, sequence)
) WITHOUT ROWID;

-- R2.2: the history is the truth. A row is inserted once and never changed.
CREATE TRIGGER flow_step_append_only BEFORE UPDATE ON flow_step
BEGIN
    SELECT RAISE(ABORT, 'flow_step is append-only: rows are inserted, never updated');
END;

CREATE TABLE outbox_event (
    staged_seq     INTEGER PRIMARY KEY AUTOINCREMENT, -- global staging order, never reused (see 0004)
    event_id       TEXT    NOT NULL UNIQUE,
    instance_id    TEXT    NOT NULL REFERENCES flow_instance (instance_id) ON DELETE CASCADE,
    sequence       INTEGER NOT NULL,                  -- the step commit that staged it
    ordinal        INTEGER NOT NULL,                  -- position within that commit
    type           TEXT    NOT NULL,
    schema_version TEXT    NOT NULL,
    partition_key  TEXT,
    payload        TEXT    NOT NULL,                  -- json
    staged_at      TEXT    NOT NULL,
    published_at   TEXT                               -- null = pending
);
CREATE INDEX outbox_event_instance_idx ON outbox_event (instance_id, sequence, ordinal);

-- No FK to flow_instance, deliberately: a lease is taken before its instance exists.
-- Never deleted: release and expiry update expires_at, so tokens never restart (R3.1).
CREATE TABLE flow_lease (
    instance_id   TEXT    PRIMARY KEY,
    owner_node    TEXT    NOT NULL,
    fencing_token INTEGER NOT NULL,
    expires_at    TEXT    NOT NULL,
    acquired_at   TEXT    NOT NULL
);

CREATE TABLE retention_policy (
    flow_id     TEXT NOT NULL,                        -- '*' is the default
    state_class TEXT NOT NULL CHECK (state_class IN ('Completed', 'Failed', 'Suspended',
                    'OutboxPublished')),
    retain_for_seconds INTEGER,                       -- null = not on a timer
    PRIMARY KEY (flow_id, state_class)
);
INSERT INTO retention_policy (flow_id, state_class, retain_for_seconds) VALUES
    ('*', 'Completed', 2592000),        -- 30 days
    ('*', 'Failed', 15552000),          -- 180 days; covers TimedOut and CompensationFailed
    ('*', 'Suspended', NULL),           -- never on a timer
    ('*', 'OutboxPublished', 604800);   -- 7 days

CREATE TABLE change_cursor (
    consumer        TEXT    PRIMARY KEY,
    last_staged_seq INTEGER NOT NULL DEFAULT 0,
    updated_at      TEXT    NOT NULL
);
