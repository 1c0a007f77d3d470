-- kirim schema version 1 (SQLite)
--
-- upgrade: stop: it creates the schema; no kirim runs on the database before it

CREATE TABLE kirim_deliveries (
    id                  INTEGER PRIMARY KEY,
    idempotency_key     TEXT    NOT NULL,
    event_id            TEXT    NOT NULL,
    recipient           TEXT    NOT NULL,
    channel             TEXT    NOT NULL,
    payload             TEXT    NOT NULL,
    payload_hash        TEXT    NOT NULL,
    status              TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN
        ('pending', 'processing', 'sent', 'confirmed', 'failed', 'canceled', 'in_doubt')),
    claim_token         TEXT,
    claimed_by          TEXT,
    claim_expires_at    REAL,
    provider_message_id TEXT,
    doubt               TEXT CHECK (doubt IN ('assumed_sent', 'held', 'resolved')),
    released_at         REAL,
    last_error          TEXT,
    created_at          REAL    NOT NULL,
    updated_at          REAL    NOT NULL,
    sent_at             REAL
);

-- The business guarantee: one delivery per idempotency key, enforced by the database.
CREATE UNIQUE INDEX kirim_deliveries_key ON kirim_deliveries (idempotency_key);
CREATE INDEX kirim_deliveries_status ON kirim_deliveries (status, id);

CREATE TABLE kirim_jobs (
    id               INTEGER PRIMARY KEY,
    delivery_id      INTEGER NOT NULL REFERENCES kirim_deliveries (id),
    status           TEXT    NOT NULL DEFAULT 'queued' CHECK (status IN
        ('queued', 'running', 'retry_scheduled', 'completed', 'dead')),
    run_at           REAL    NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_token      TEXT,
    lease_expires_at REAL,
    last_error       TEXT,
    created_at       REAL    NOT NULL,
    updated_at       REAL    NOT NULL
);

-- At most one active job per delivery.
CREATE UNIQUE INDEX kirim_jobs_one_active ON kirim_jobs (delivery_id)
    WHERE status IN ('queued', 'running', 'retry_scheduled');
CREATE INDEX kirim_jobs_due ON kirim_jobs (run_at, id)
    WHERE status IN ('queued', 'retry_scheduled');
CREATE INDEX kirim_jobs_leased ON kirim_jobs (lease_expires_at)
    WHERE status = 'running';
CREATE INDEX kirim_jobs_dead ON kirim_jobs (id) WHERE status = 'dead';
CREATE INDEX kirim_jobs_delivery ON kirim_jobs (delivery_id, id);

CREATE TABLE kirim_attempts (
    id                  INTEGER PRIMARY KEY,
    delivery_id         INTEGER NOT NULL REFERENCES kirim_deliveries (id),
    job_id              INTEGER NOT NULL REFERENCES kirim_jobs (id),
    number              INTEGER NOT NULL,
    provider_request_id TEXT    NOT NULL,
    worker_id           TEXT    NOT NULL,
    status              TEXT    NOT NULL DEFAULT 'requested' CHECK (status IN
        ('requested', 'succeeded', 'failed_permanent', 'failed_transient', 'unknown')),
    provider_message_id TEXT,
    error               TEXT,
    requested_at        REAL    NOT NULL,
    completed_at        REAL
);

CREATE UNIQUE INDEX kirim_attempts_request ON kirim_attempts (provider_request_id);
CREATE INDEX kirim_attempts_delivery ON kirim_attempts (delivery_id, id);
