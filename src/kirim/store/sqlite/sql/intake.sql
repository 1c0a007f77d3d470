-- What comes in (kirim.store.intake): deliveries and their jobs, and the HTTP
-- service's idempotent requests. Named parameters.

-- name: insert_deliveries
-- The same for a batch (:items, in order: ids follow it), each key unless it exists or
-- its tombstone is kept; a key twice in the batch is inserted once. An item with a
-- reason in `suppressed` is recorded suppressed, with that reason. Only the ids and
-- the time come back: the rest of each row is what was given (kirim.store.intake
-- builds it); the jobs follow in a statement of their own (no job_id here).
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
RETURNING id, idempotency_key, created_at, NULL AS job_id;

-- name: insert_jobs_of
-- The jobs of deliveries just inserted (:items, in order): queued, or completed (with
-- the reason as its last error) for a suppressed delivery, so that no worker runs it.
INSERT INTO kirim_jobs
    (delivery_id, status, run_at, max_attempts, last_error, created_at, updated_at)
SELECT u.value ->> 'delivery_id', u.value ->> 'status',
       coalesce(u.value ->> 'run_at', :now),
       u.value ->> 'max_attempts', u.value ->> 'last_error', :now, :now
FROM json_each(:items) AS u
ORDER BY u.key
RETURNING id, delivery_id;

-- name: deliveries_by_keys
-- Deliveries with their most recent job (:keys, a JSON list).
SELECT d.*,
       j.id AS job_id, j.delivery_id AS job_delivery_id, j.status AS job_status,
       j.run_at AS job_run_at, j.attempts AS job_attempts, j.max_attempts AS job_max_attempts,
       j.lease_owner AS job_lease_owner, j.lease_token AS job_lease_token,
       j.lease_expires_at AS job_lease_expires_at, j.last_error AS job_last_error,
       j.created_at AS job_created_at, j.updated_at AS job_updated_at
FROM kirim_deliveries d
LEFT JOIN kirim_jobs j
  ON j.id = (SELECT max(id) FROM kirim_jobs WHERE delivery_id = d.id)
WHERE d.idempotency_key IN (SELECT value FROM json_each(:keys));

-- name: tombstones_by_hashes
-- The tombstones of pruned deliveries, by their keys' sha256 (:key_hashes, JSON).
SELECT * FROM kirim_key_tombstones
WHERE key_hash IN (SELECT value FROM json_each(:key_hashes));

-- name: insert_request
-- Take an idempotency key for one HTTP request (nothing when a row exists).
INSERT INTO kirim_requests
    (idempotency_key, fingerprint, state, lock_token, locked_until, created_at, updated_at)
VALUES (:key, :fingerprint, 'in_progress', :token, :now + :hold, :now, :now)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING idempotency_key;

-- name: take_over_request
-- Take over a key whose holder stopped before answering (its hold expired).
UPDATE kirim_requests
SET fingerprint = :fingerprint, lock_token = :token, locked_until = :now + :hold,
    updated_at = :now
WHERE idempotency_key = :key AND state = 'in_progress' AND locked_until < :now
RETURNING idempotency_key;

-- name: request_by_key
-- Who holds, or held, an idempotency key.
SELECT * FROM kirim_requests WHERE idempotency_key = :key;

-- name: complete_requests
-- Keep the response to replay, while this request still holds the key, or while the
-- key is in progress for the same body (:fingerprint, given by a request that created
-- the delivery: another that took the key over meanwhile must not lose its answer).
UPDATE kirim_requests
SET state = 'completed', status_code = :status_code, response = :response,
    delivery_id = :delivery_id, lock_token = NULL, locked_until = NULL, updated_at = :now
WHERE idempotency_key = :key AND state = 'in_progress'
  AND (lock_token = :token OR (:fingerprint IS NOT NULL AND fingerprint = :fingerprint));

-- name: release_requests
-- Give the key back (the request failed; an error is not replayed).
DELETE FROM kirim_requests
WHERE idempotency_key = :key AND lock_token = :token AND state = 'in_progress';
