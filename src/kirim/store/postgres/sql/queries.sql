-- Named queries of the PostgreSQL backend that are not transitions nor intake: the
-- schema's version, reads for the worker's idle loop, operators, gauges and the HTTP
-- service's tokens (psycopg placeholders: %(name)s). Time: kirim_now(%(now)s) is the
-- time of record (migration 0003): the caller's time when the store was opened with
-- one, else (NULL) the database's own clock.

-- name: migrate_lock
-- One migration at a time, across every host (the bytes of "kirimmig").
SELECT pg_advisory_xact_lock(7739843231745927527);

-- name: create_meta
-- The table that records the schema's version (before the first migration).
CREATE TABLE IF NOT EXISTS kirim_meta (key text PRIMARY KEY, value text NOT NULL);

-- name: meta_exists
-- Whether the schema's version table exists.
SELECT to_regclass('kirim_meta') IS NOT NULL AS present;

-- name: schema_version
-- The schema's version.
SELECT value FROM kirim_meta WHERE key = 'schema_version';

-- name: set_schema_version
-- Record the version a migration reached.
INSERT INTO kirim_meta (key, value) VALUES ('schema_version', %(version)s)
ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: tokens
-- API tokens, oldest first; the revoked ones only when %(all)s.
SELECT * FROM kirim_tokens WHERE %(all)s::boolean OR revoked_at IS NULL ORDER BY id;

-- name: one_snapshot
-- A read of several statements (a record, a feed page and its counts, the dashboard's
-- counts) reads one snapshot: REPEATABLE READ, read only (which never fails to
-- serialize), said first in its transaction, before any statement reads. At READ
-- COMMITTED, the level of every other transaction (connect.ISOLATION), each
-- statement would read a snapshot of its own: a record read while a worker finished
-- could show the delivery processing beside its succeeded attempt.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: no_jit
-- Every transaction the store runs, and every statement it runs alone (a batch's
-- intents, its plain finish), begins with this, in the same round trip as its first
-- statement (the driver's `drive`, `lead`): PostgreSQL's JIT off for that transaction
-- only (set_config's is_local, as SET LOCAL: a pooler's shared session keeps its
-- settings; a statement run alone on a direct connection shares the implicit
-- transaction of one pipeline with it). kirim's statements read and write batches by
-- key, in a millisecond or two; the JIT compiles a statement whose estimated cost
-- passes jit_above_cost (100,000 by default), and the estimates of the batch
-- statements pass it once a table has tens of thousands of rows with statistics that
-- lag (a finish of 256 deliveries: 5 ms of work, 50 ms of compiling), or at any size
-- where plan_by_index leaves a path it disabled (costed 10^10). Not sent with a read
-- of one statement in autocommit (one round trip, the session's settings), nor in a
-- caller's transaction (run_in): the caller's later statements would inherit it.
SELECT set_config('jit', 'off', true);

-- name: store_now
-- The time of record.
SELECT kirim_now(%(now)s::float8) AS now;

-- name: ping
-- Does the database answer? (The worker's heartbeat, with no lease to renew.)
SELECT 1 AS one;

-- name: next_run_at
-- When the earliest claimable job is due.
SELECT MIN(run_at) AS run_at FROM kirim_jobs WHERE status IN ('queued', 'retry_scheduled');

-- name: next_due_in
-- Seconds until the earliest claimable job is due, in the time of record.
SELECT MIN(run_at) - kirim_now(%(now)s::float8) AS due_in FROM kirim_jobs
WHERE status IN ('queued', 'retry_scheduled');

-- name: count_running
-- Unfinished work of earlier claims: jobs running or waiting for a retry.
SELECT COUNT(*) AS n FROM kirim_jobs WHERE status IN ('running', 'retry_scheduled');

-- name: delivery_by_key
-- One delivery by its idempotency key.
SELECT * FROM kirim_deliveries WHERE idempotency_key = %(key)s;

-- name: delivery_by_id
-- One delivery.
SELECT * FROM kirim_deliveries WHERE id = %(id)s;

-- name: latest_job
-- The delivery's most recent job.
SELECT * FROM kirim_jobs WHERE delivery_id = %(delivery_id)s ORDER BY id DESC LIMIT 1;

-- name: attempts_of
-- Every attempt of a delivery.
SELECT * FROM kirim_attempts WHERE delivery_id = %(delivery_id)s ORDER BY id;

-- name: dead_letters
-- Dead jobs, oldest first, each with its delivery.
SELECT d.*,
       j.id AS job_id, j.delivery_id AS job_delivery_id, j.status AS job_status,
       j.run_at AS job_run_at, j.attempts AS job_attempts, j.max_attempts AS job_max_attempts,
       j.lease_owner AS job_lease_owner, j.lease_token AS job_lease_token,
       j.lease_expires_at AS job_lease_expires_at, j.last_error AS job_last_error,
       j.created_at AS job_created_at, j.updated_at AS job_updated_at
FROM (SELECT * FROM kirim_jobs WHERE status = 'dead' ORDER BY id LIMIT %(limit)s) AS j
JOIN kirim_deliveries d ON d.id = j.delivery_id
ORDER BY j.id;

-- name: count_deliveries
-- Deliveries per status.
SELECT status, COUNT(*) AS n FROM kirim_deliveries GROUP BY status ORDER BY status;

-- name: deliveries_by_status_doubt
-- Gauges: deliveries per status and doubt (one scan, every few seconds).
SELECT status, doubt, count(*) AS n FROM kirim_deliveries GROUP BY status, doubt;

-- name: due_jobs_summary
-- Gauges: claimable jobs due now, and the run_at of the oldest (the due index).
SELECT count(*) AS n, min(run_at) AS oldest FROM kirim_jobs
WHERE status IN ('queued', 'retry_scheduled') AND run_at <= kirim_now(%(now)s::float8);

-- name: count_jobs
-- Jobs per status.
SELECT status, COUNT(*) AS n FROM kirim_jobs GROUP BY status ORDER BY status;

-- name: search_deliveries
-- The dashboard's search: a delivery id, an idempotency key or an event id (indexed).
SELECT * FROM kirim_deliveries
WHERE id = %(id)s::bigint OR idempotency_key = %(text)s OR event_id = %(text)s
ORDER BY id DESC
LIMIT %(limit)s;

-- name: insert_token
-- A new API token (its hash); nothing when an active token has the name.
INSERT INTO kirim_tokens (name, token_hash, prefix, created_at)
VALUES (%(name)s, %(hash)s, %(prefix)s, kirim_now(%(now)s::float8))
ON CONFLICT DO NOTHING
RETURNING *;

-- name: token_by_hash
-- The active token with this hash.
SELECT * FROM kirim_tokens WHERE token_hash = %(hash)s AND revoked_at IS NULL;

-- name: revoke_token_by_name
-- Revoke the active token with this name.
UPDATE kirim_tokens SET revoked_at = kirim_now(%(now)s::float8)
WHERE name = %(name)s AND revoked_at IS NULL
RETURNING *;

-- name: revoke_token_by_id
-- Revoke the token with this id, if active.
UPDATE kirim_tokens SET revoked_at = kirim_now(%(now)s::float8)
WHERE id = %(id)s::bigint AND revoked_at IS NULL
RETURNING *;

-- name: waiting_jobs
-- What a burst worker waits for: per status, the jobs running (the last lease end),
-- waiting for a retry and queued for after now (the first run_at of each).
SELECT status, COUNT(*) AS n, MIN(run_at) AS first_run_at, MAX(lease_expires_at) AS last_lease
FROM kirim_jobs
WHERE status IN ('running', 'retry_scheduled')
   OR (status = 'queued' AND run_at > kirim_now(%(now)s::float8))
GROUP BY status;
