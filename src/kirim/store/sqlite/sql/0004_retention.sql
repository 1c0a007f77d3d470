-- kirim schema version 4 (SQLite): retention (`kirim prune`, the worker's [retention]).
--
-- A finished delivery older than the retention is deleted with its jobs, attempts and
-- HTTP request rows; its idempotency key is remembered a while longer here, as the
-- sha256 (hex) of the key, so that a notify() with that key still creates nothing.
-- seen_at is the delivery's created_at; pruned_at when it was deleted (tombstones
-- older than [retention] keys are deleted in turn, then the key is free again).
--
-- upgrade: safe: it adds the tombstones table and indexes, which older workers never
--   read; prune (kirim prune, [retention]) only once every process that enqueues runs
--   the newer kirim, since an older one does not read tombstones
CREATE TABLE kirim_key_tombstones (
    key_hash    TEXT    PRIMARY KEY,
    delivery_id INTEGER NOT NULL,
    status      TEXT    NOT NULL CHECK (status IN ('sent', 'failed', 'canceled')),
    seen_at     REAL    NOT NULL,
    pruned_at   REAL    NOT NULL
);

CREATE INDEX kirim_key_tombstones_pruned ON kirim_key_tombstones (pruned_at);

-- Prune finds the finished deliveries last changed before its cut-off, oldest first,
-- without reading and sorting every finished one (the ledger's bulk, once it is large).
CREATE INDEX kirim_deliveries_finished ON kirim_deliveries (updated_at, id)
    WHERE status IN ('sent', 'failed', 'canceled');

-- Deleting a job checks that no attempt refers to it, and deleting a delivery finds its
-- request rows: both by index, not by a scan of the whole table per row.
CREATE INDEX kirim_attempts_job ON kirim_attempts (job_id);
CREATE INDEX kirim_requests_delivery ON kirim_requests (delivery_id);
