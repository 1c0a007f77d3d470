-- kirim schema version 2 (SQLite): the HTTP service's API tokens and idempotent requests.
--
-- upgrade: safe: it adds the HTTP service's tables (tokens, requests), which older
--   workers never read

-- Bearer tokens of `kirim serve`. Only the sha256 of a token is stored; `prefix` (its
-- first characters) lets an operator recognise one in `kirim token list`.
CREATE TABLE kirim_tokens (
    id         INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    token_hash TEXT    NOT NULL,
    prefix     TEXT    NOT NULL,
    created_at REAL    NOT NULL,
    revoked_at REAL
);

CREATE UNIQUE INDEX kirim_tokens_hash ON kirim_tokens (token_hash);
-- One active token per name (a revoked name can be used again).
CREATE UNIQUE INDEX kirim_tokens_active_name ON kirim_tokens (name) WHERE revoked_at IS NULL;

-- One row per idempotency key that POST /v1/notifications saw (the IETF
-- Idempotency-Key semantics): the request's fingerprint (sha256 of its canonical body),
-- 'in_progress' while a server holds it (until locked_until, so that a crashed server
-- does not hold it for ever), then 'completed' with the response to replay.
CREATE TABLE kirim_requests (
    idempotency_key TEXT    PRIMARY KEY,
    fingerprint     TEXT    NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed')),
    lock_token      TEXT,
    locked_until    REAL,
    status_code     INTEGER,
    response        TEXT,
    delivery_id     INTEGER,
    created_at      REAL    NOT NULL,
    updated_at      REAL    NOT NULL
);

-- The dashboard finds deliveries by event id.
CREATE INDEX kirim_deliveries_event ON kirim_deliveries (event_id, id);
