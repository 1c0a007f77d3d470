-- kirim schema version 14 (PostgreSQL): workflow runs and their steps (kirim.runs).
--
-- upgrade: safe: two tables older workers never read or write; a type with steps is
--   known only to the newer kirim (add one once every worker runs it)
--
-- One run per (type, event, recipient): its key is UNIQUE, so a retried event makes
-- none twice. It keeps its type's steps as they were (steps), the event's data, and
-- each send step's message rendered when the event was recorded (messages: channel ->
-- recipient, payload, payload_hash). cursor: the next step; next_at: when it is due
-- (NULL once the run is over; a canceled run's while one of its deliveries may still be
-- sent, so that a worker comes back to cancel it). A worker claims a due run with a lease and a fencing
-- token (claim_token, claimed_by, claim_expires_at), as it claims a job.
CREATE TABLE kirim_runs (
    id               bigserial PRIMARY KEY,
    key              TEXT NOT NULL UNIQUE,
    type             TEXT NOT NULL,
    event_id         TEXT NOT NULL,
    recipient_id     TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('waiting', 'done', 'canceled')),
    cursor           INTEGER NOT NULL DEFAULT 0,
    next_at          double precision,
    steps            TEXT NOT NULL,
    data             TEXT NOT NULL,
    messages         TEXT NOT NULL,
    max_attempts     INTEGER NOT NULL,
    cancel_value     TEXT,
    why              TEXT,
    claim_token      TEXT,
    claimed_by       TEXT,
    claim_expires_at double precision,
    created_at       double precision NOT NULL,
    updated_at       double precision NOT NULL
);
CREATE INDEX kirim_runs_due ON kirim_runs (next_at) WHERE next_at IS NOT NULL;
CREATE INDEX kirim_runs_cancel ON kirim_runs (type, cancel_value) WHERE status <> 'canceled';

-- What became of each step of a run, once: the primary key is (run, step), and only
-- the holder of the run's claim writes it (fenced in the same transaction).
CREATE TABLE kirim_run_steps (
    run_id      bigint NOT NULL REFERENCES kirim_runs (id) ON DELETE CASCADE,
    idx         INTEGER NOT NULL,
    outcome     TEXT NOT NULL CHECK (outcome IN ('sent', 'waited', 'then', 'else', 'skipped')),
    why         TEXT NOT NULL,
    delivery_id bigint,
    until_at    double precision,
    created_at  double precision NOT NULL,
    PRIMARY KEY (run_id, idx)
);
CREATE INDEX kirim_feed_by_delivery ON kirim_feed (delivery_id);
