-- What comes in (kirim.store.sqlite.intake): deliveries and their jobs, and the HTTP
-- service's idempotent requests. Named parameters.

-- name: insert_delivery
-- Insert a delivery unless its idempotency key exists, or existed and was pruned while
-- its tombstone (the key's sha256, :key_hash) is kept.
INSERT INTO kirim_deliveries
    (idempotency_key, event_id, recipient, channel, payload, payload_hash, status,
     created_at, updated_at)
SELECT :key, :event_id, :recipient, :channel, :payload, :payload_hash, 'pending', :now, :now
WHERE NOT EXISTS (SELECT 1 FROM kirim_key_tombstones WHERE key_hash = :key_hash)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING *;

-- name: insert_deliveries
-- The same for a batch (:items, in order: ids follow it), each key unless it exists or
-- its tombstone is kept; a key twice in the batch is inserted once. An item with a
-- reason in `suppressed` is recorded suppressed, with that reason. Only the ids come
-- back: the rest of each row is what was given (kirim.store.sqlite.intake builds it).
INSERT INTO kirim_deliveries
    (idempotency_key, event_id, recipient, channel, payload, payload_hash, status,
     type, recipient_id, reason, created_at, updated_at)
SELECT u.value ->> 'key', u.value ->> 'event_id', u.value ->> 'recipient',
       u.value ->> 'channel', u.value ->> 'payload', u.value ->> 'payload_hash',
       CASE WHEN u.value ->> 'suppressed' IS NULL THEN 'pending' ELSE 'suppressed' END,
       u.value ->> 'type', u.value ->> 'recipient_id', u.value ->> 'suppressed',
       :now, :now
FROM json_each(:items) AS u
WHERE NOT EXISTS (
    SELECT 1 FROM kirim_key_tombstones t WHERE t.key_hash = u.value ->> 'key_hash')
ORDER BY u.key
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, idempotency_key;

-- name: insert_jobs_of
-- The jobs of deliveries just inserted (:items, in order): queued, or completed (with
-- the reason as its last error) for a suppressed delivery, so that no worker runs it.
INSERT INTO kirim_jobs
    (delivery_id, status, run_at, max_attempts, last_error, created_at, updated_at)
SELECT u.value ->> 'delivery_id', u.value ->> 'status', u.value ->> 'run_at',
       u.value ->> 'max_attempts', u.value ->> 'last_error', :now, :now
FROM json_each(:items) AS u
ORDER BY u.key
RETURNING id, delivery_id;

-- name: tombstone_by_hash
-- The tombstone of a pruned delivery, by its key's sha256.
SELECT * FROM kirim_key_tombstones WHERE key_hash = :key_hash;

-- name: insert_job
-- Insert the job that carries a delivery.
INSERT INTO kirim_jobs (delivery_id, status, run_at, max_attempts, created_at, updated_at)
VALUES (:delivery_id, 'queued', :run_at, :max_attempts, :now, :now)
RETURNING *;

-- name: insert_request
-- Take an idempotency key for one HTTP request (nothing when a row exists).
INSERT INTO kirim_requests
    (idempotency_key, fingerprint, state, lock_token, locked_until, created_at, updated_at)
VALUES (:key, :fingerprint, 'in_progress', :token, :until, :now, :now)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING idempotency_key;

-- name: take_over_request
-- Take over a key whose holder stopped before answering (its hold expired).
UPDATE kirim_requests
SET fingerprint = :fingerprint, lock_token = :token, locked_until = :until, updated_at = :now
WHERE idempotency_key = :key AND state = 'in_progress' AND locked_until < :now
RETURNING idempotency_key;

-- name: request_by_key
-- Who holds, or held, an idempotency key.
SELECT * FROM kirim_requests WHERE idempotency_key = :key;

-- name: complete_request
-- Keep the response to replay, while this request still holds the key, or while the
-- key is in progress for the same body (:fingerprint, given by a request that created
-- the delivery: another that took the key over meanwhile must not lose its answer).
UPDATE kirim_requests
SET state = 'completed', status_code = :status_code, response = :response,
    delivery_id = :delivery_id, lock_token = NULL, locked_until = NULL, updated_at = :now
WHERE idempotency_key = :key AND state = 'in_progress'
  AND (lock_token = :token OR (:fingerprint IS NOT NULL AND fingerprint = :fingerprint));

-- name: release_request
-- Give the key back (the request failed; an error is not replayed).
DELETE FROM kirim_requests
WHERE idempotency_key = :key AND lock_token = :token AND state = 'in_progress';
