-- What comes in (kirim.store.intake): deliveries and their jobs, and the HTTP
-- service's idempotent requests (psycopg placeholders: %(name)s; batches as arrays).

-- name: insert_deliveries
-- Insert deliveries (items, as i_<column> arrays) and their jobs, in one statement; a
-- key that exists is left alone (returned later), and so is a key whose delivery was
-- pruned while its tombstone is kept (i_key_hash: each key's sha256). An item with a
-- reason in i_suppressed is recorded suppressed with it, its job completed.
WITH u AS (
    SELECT * FROM unnest(
        %(i_key)s::text[], %(i_event_id)s::text[], %(i_recipient)s::text[],
        %(i_channel)s::text[], %(i_payload)s::text[], %(i_payload_hash)s::text[],
        %(i_run_at)s::float8[], %(i_max_attempts)s::int[], %(i_key_hash)s::text[],
        %(i_type)s::text[], %(i_recipient_id)s::text[], %(i_suppressed)s::text[]
    ) WITH ORDINALITY AS u (idempotency_key, event_id, recipient, channel, payload,
                            payload_hash, run_at, max_attempts, key_hash, type,
                            recipient_id, suppressed, idx)
),
firsts AS (
    SELECT DISTINCT ON (idempotency_key) * FROM u ORDER BY idempotency_key, idx
),
ins AS (
    -- Known keys are filtered out first so that they use up no ids (as in SQLite);
    -- ON CONFLICT covers a key inserted concurrently by another transaction.
    INSERT INTO kirim_deliveries
        (idempotency_key, event_id, recipient, channel, payload, payload_hash, status,
         type, recipient_id, reason, created_at, updated_at)
    SELECT f.idempotency_key, f.event_id, f.recipient, f.channel, f.payload, f.payload_hash,
           CASE WHEN f.suppressed IS NULL THEN 'pending' ELSE 'suppressed' END,
           f.type, f.recipient_id, f.suppressed,
           kirim_now(%(now)s::float8), kirim_now(%(now)s::float8)
    FROM firsts f
    WHERE NOT EXISTS (
        SELECT 1 FROM kirim_deliveries d WHERE d.idempotency_key = f.idempotency_key)
      AND NOT EXISTS (
        SELECT 1 FROM kirim_key_tombstones t WHERE t.key_hash = f.key_hash)
    ORDER BY f.idx
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING *
),
jobs AS (
    INSERT INTO kirim_jobs
        (delivery_id, status, run_at, max_attempts, last_error, created_at, updated_at)
    SELECT ins.id, CASE WHEN f.suppressed IS NULL THEN 'queued' ELSE 'completed' END,
           COALESCE(f.run_at, kirim_now(%(now)s::float8)), f.max_attempts,
           'suppressed (' || f.suppressed || ')',
           kirim_now(%(now)s::float8), kirim_now(%(now)s::float8)
    FROM ins JOIN firsts f ON f.idempotency_key = ins.idempotency_key
    ORDER BY ins.id
    RETURNING *
),
woke AS (
    SELECT pg_notify('kirim_jobs', '') FROM (SELECT 1 FROM jobs LIMIT 1) AS any_job
)
-- The new deliveries in id order, each with its job's id.
SELECT ins.id, ins.idempotency_key, ins.created_at, jobs.id AS job_id,
       (SELECT count(*) FROM woke) AS woke
FROM ins JOIN jobs ON jobs.delivery_id = ins.id
ORDER BY ins.id;

-- name: deliveries_by_keys
-- Deliveries with their most recent job.
SELECT d.*,
       j.id AS job_id, j.delivery_id AS job_delivery_id, j.status AS job_status,
       j.run_at AS job_run_at, j.attempts AS job_attempts, j.max_attempts AS job_max_attempts,
       j.lease_owner AS job_lease_owner, j.lease_token AS job_lease_token,
       j.lease_expires_at AS job_lease_expires_at, j.last_error AS job_last_error,
       j.created_at AS job_created_at, j.updated_at AS job_updated_at
FROM kirim_deliveries d
LEFT JOIN LATERAL (
    SELECT * FROM kirim_jobs WHERE delivery_id = d.id ORDER BY id DESC LIMIT 1
) j ON true
WHERE d.idempotency_key = ANY (%(keys)s::text[]);

-- name: tombstones_by_hashes
-- The tombstones of pruned deliveries, by their keys' sha256.
SELECT * FROM kirim_key_tombstones WHERE key_hash = ANY (%(key_hashes)s::text[]);

-- name: insert_request
-- Take an idempotency key for one HTTP request (nothing when a row exists; a row being
-- inserted by another transaction is waited for).
INSERT INTO kirim_requests
    (idempotency_key, fingerprint, state, lock_token, locked_until, created_at, updated_at)
VALUES (%(key)s, %(fingerprint)s, 'in_progress', %(token)s, (kirim_now(%(now)s::float8) + %(hold)s::float8),
        kirim_now(%(now)s::float8), kirim_now(%(now)s::float8))
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING idempotency_key;

-- name: take_over_request
-- Take over a key whose holder stopped before answering (its hold expired).
UPDATE kirim_requests
SET fingerprint = %(fingerprint)s, lock_token = %(token)s, locked_until = (kirim_now(%(now)s::float8) + %(hold)s::float8),
    updated_at = kirim_now(%(now)s::float8)
WHERE idempotency_key = %(key)s AND state = 'in_progress' AND locked_until < kirim_now(%(now)s::float8)
RETURNING idempotency_key;

-- name: request_by_key
-- Who holds, or held, an idempotency key.
SELECT * FROM kirim_requests WHERE idempotency_key = %(key)s;

-- name: complete_requests
-- Keep the responses to replay (items, as i_<column> arrays), where each request still
-- holds its key, or where the key is in progress for the same body (u.fingerprint,
-- given by a request that created the delivery: another that took the key over
-- meanwhile must not lose its answer).
UPDATE kirim_requests r
SET state = 'completed', status_code = u.status_code, response = u.response,
    delivery_id = u.delivery_id, lock_token = NULL, locked_until = NULL,
    updated_at = kirim_now(%(now)s::float8)
FROM unnest(%(i_key)s::text[], %(i_token)s::text[], %(i_status_code)s::int[],
            %(i_response)s::text[], %(i_delivery_id)s::bigint[], %(i_fingerprint)s::text[])
     AS u (idempotency_key, lock_token, status_code, response, delivery_id, fingerprint)
WHERE r.idempotency_key = u.idempotency_key AND r.state = 'in_progress'
  AND (r.lock_token = u.lock_token OR r.fingerprint = u.fingerprint);

-- name: release_requests
-- Give the keys back (the requests failed; an error is not replayed).
DELETE FROM kirim_requests r
USING unnest(%(i_key)s::text[], %(i_token)s::text[]) AS u (idempotency_key, lock_token)
WHERE r.idempotency_key = u.idempotency_key AND r.lock_token = u.lock_token
  AND r.state = 'in_progress';
