-- name: insert_delivery
-- Insert a delivery unless its idempotency key exists.
INSERT INTO kirim_deliveries
    (idempotency_key, event_id, recipient, channel, payload, payload_hash, status,
     created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id;

-- name: insert_job
-- Insert the job that carries a delivery.
INSERT INTO kirim_jobs (delivery_id, status, run_at, max_attempts, created_at, updated_at)
VALUES (?, 'queued', ?, ?, ?, ?)
RETURNING id;

-- name: select_due_jobs
-- The due jobs, oldest first.
SELECT id FROM kirim_jobs
WHERE status IN ('queued', 'retry_scheduled') AND run_at <= ?
ORDER BY run_at, id
LIMIT ?;

-- name: lease_job
-- Lease one claimable job with a fresh token.
UPDATE kirim_jobs
SET status = 'running', attempts = attempts + 1, lease_owner = ?, lease_token = ?,
    lease_expires_at = ?, updated_at = ?
WHERE id = ? AND status IN ('queued', 'retry_scheduled')
RETURNING *;

-- name: claim_pending_delivery
-- pending -> processing; 0 rows when another worker got there first.
UPDATE kirim_deliveries
SET status = 'processing', claim_token = ?, claimed_by = ?, claim_expires_at = ?, updated_at = ?
WHERE id = ? AND status = 'pending'
RETURNING *;

-- name: take_over_delivery
-- Take over a processing delivery whose claim expired.
UPDATE kirim_deliveries
SET claim_token = ?, claimed_by = ?, claim_expires_at = ?, updated_at = ?
WHERE id = ? AND status = 'processing'
  AND (claim_expires_at IS NULL OR claim_expires_at < ?)
RETURNING *;

-- name: doubtful_attempts
-- Attempts that may have reached the provider, since the operator's last release.
SELECT a.* FROM kirim_attempts a JOIN kirim_deliveries d ON d.id = a.delivery_id
WHERE a.delivery_id = ? AND a.status IN ('requested', 'unknown')
  AND a.requested_at >= COALESCE(d.released_at, 0)
ORDER BY a.id;

-- name: count_attempts
-- How many outbound requests (attempt rows) a delivery already had (index only).
SELECT COUNT(*) AS n FROM kirim_attempts WHERE delivery_id = ?;

-- name: succeeded_attempt
-- Any attempt of the delivery that succeeded.
SELECT provider_message_id FROM kirim_attempts
WHERE delivery_id = ? AND status = 'succeeded'
ORDER BY id LIMIT 1;

-- name: insert_attempt_fenced
-- Write-ahead attempt intent, only while the claim token holds, bounded in time: no
-- request after send_deadline, none can land after settles_at.
INSERT INTO kirim_attempts
    (delivery_id, job_id, number, provider_request_id, worker_id, status, requested_at,
     send_deadline, settles_at)
SELECT :delivery_id, :job_id, :number, :request_id, :worker_id, 'requested', :now,
       :send_deadline, :settles_at
WHERE EXISTS (SELECT 1 FROM kirim_deliveries
              WHERE id = :delivery_id AND claim_token = :token AND status = 'processing');

-- name: complete_attempt
-- Record a request's outcome; a fact is recorded whatever the claim's fate.
UPDATE kirim_attempts
SET status = ?, provider_message_id = COALESCE(?, provider_message_id), error = ?,
    completed_at = ?
WHERE provider_request_id = ? AND status IN ('requested', 'unknown');

-- name: finish_delivery
-- Write the delivery's new status, fenced by the claim token; releases the claim.
UPDATE kirim_deliveries
SET status = ?, doubt = ?, provider_message_id = COALESCE(?, provider_message_id),
    last_error = ?, claim_token = NULL, claimed_by = NULL, claim_expires_at = NULL,
    sent_at = CASE WHEN ? = 'sent' THEN ? ELSE sent_at END, updated_at = ?
WHERE id = ? AND claim_token = ?;

-- name: finish_job
-- Write the job's new state, fenced by the lease token; releases the lease (and gives
-- the claim back when it only waited for doubt to settle).
UPDATE kirim_jobs
SET status = ?, run_at = COALESCE(?, run_at), last_error = ?, attempts = attempts - ?,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = ?
WHERE id = ? AND lease_token = ?;

-- name: latest_job
-- The delivery's most recent job.
SELECT * FROM kirim_jobs WHERE delivery_id = ? ORDER BY id DESC LIMIT 1;

-- name: reopen_delivery
-- A late definite failure withdrew an assumption: pending again, or failed.
UPDATE kirim_deliveries
SET status = ?, doubt = 'resolved', last_error = ?, claim_token = NULL, claimed_by = NULL,
    claim_expires_at = NULL, sent_at = NULL, provider_message_id = NULL, updated_at = ?
WHERE id = ?;

-- name: reopen_job
-- ... and its latest job runs again (retry_scheduled), or is a dead letter.
UPDATE kirim_jobs
SET status = ?, run_at = ?, last_error = ?, lease_owner = NULL, lease_token = NULL,
    lease_expires_at = NULL, updated_at = ?
WHERE id = ? AND status IN ('completed', 'dead');

-- name: late_success_delivery
-- A success reported after the claim was lost still makes the delivery sent.
UPDATE kirim_deliveries
SET status = 'sent', provider_message_id = COALESCE(provider_message_id, ?),
    doubt = CASE WHEN doubt IS NULL THEN NULL ELSE 'resolved' END,
    claim_token = NULL, claimed_by = NULL, claim_expires_at = NULL,
    sent_at = COALESCE(sent_at, ?), updated_at = ?
WHERE id = ?;

-- name: late_success_jobs
-- ... and ends whatever job still carries it.
UPDATE kirim_jobs
SET status = 'completed', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    last_error = 'completed by a late success', updated_at = ?
WHERE delivery_id = ? AND status IN ('queued', 'running', 'retry_scheduled', 'dead');

-- name: heartbeat_job
-- Extend a job lease while the token holds.
UPDATE kirim_jobs SET lease_expires_at = ?, updated_at = ?
WHERE id = ? AND lease_token = ? AND status = 'running';

-- name: heartbeat_delivery
-- Extend the delivery claim while the token holds.
UPDATE kirim_deliveries SET claim_expires_at = ?
WHERE id = ? AND claim_token = ?;

-- name: expired_jobs
-- Running jobs whose lease expired (with their delivery's channel, for metrics).
SELECT id, delivery_id, attempts, max_attempts, lease_owner, lease_token,
       (SELECT d.channel FROM kirim_deliveries d WHERE d.id = kirim_jobs.delivery_id) AS channel
FROM kirim_jobs
WHERE status = 'running' AND lease_expires_at < ?
ORDER BY lease_expires_at
LIMIT 1000;

-- name: requeue_expired_job
-- Back to the queue with no token: the next claim gets a new one.
UPDATE kirim_jobs
SET status = 'queued', run_at = ?, lease_owner = NULL, lease_token = NULL,
    lease_expires_at = NULL, last_error = 'lease expired', updated_at = ?
WHERE id = ? AND lease_token = ?;

-- name: revoke_expired_claim
-- The expired holder's token stops working: its intent or late status write is refused.
UPDATE kirim_deliveries SET claim_token = NULL, claim_expires_at = NULL, updated_at = ?
WHERE id = ? AND claim_token = ? AND status = 'processing';

-- name: kill_expired_job
-- The lease expired on the final attempt: dead letter.
UPDATE kirim_jobs
SET status = 'dead', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    last_error = 'lease expired on the final attempt', updated_at = ?
WHERE id = ? AND lease_token = ?;

-- name: park_expired_delivery
-- The delivery of a job that died with its lease: in doubt if a request may have left.
UPDATE kirim_deliveries
SET status = CASE WHEN EXISTS (
        SELECT 1 FROM kirim_attempts a
        WHERE a.delivery_id = kirim_deliveries.id AND a.status IN ('requested', 'unknown')
          AND a.requested_at >= COALESCE(kirim_deliveries.released_at, 0))
    THEN 'in_doubt' ELSE 'failed' END,
    doubt = CASE WHEN EXISTS (
        SELECT 1 FROM kirim_attempts a
        WHERE a.delivery_id = kirim_deliveries.id AND a.status IN ('requested', 'unknown')
          AND a.requested_at >= COALESCE(kirim_deliveries.released_at, 0))
    THEN 'held' ELSE doubt END,
    last_error = 'lease expired on the final attempt',
    claim_token = NULL, claimed_by = NULL, claim_expires_at = NULL, updated_at = ?
WHERE id = ? AND claim_token = ? AND status = 'processing';

-- name: release_busy_job
-- Another worker holds the delivery: put the job back, not counting this claim.
UPDATE kirim_jobs
SET status = 'retry_scheduled', run_at = ?, attempts = attempts - 1, lease_owner = NULL,
    lease_token = NULL, lease_expires_at = NULL, updated_at = ?
WHERE id = ? AND lease_token = ?;

-- name: next_run_at
-- When the earliest claimable job is due.
SELECT MIN(run_at) FROM kirim_jobs WHERE status IN ('queued', 'retry_scheduled');

-- name: count_running
-- Unfinished work of earlier claims: jobs running or waiting for a retry.
SELECT COUNT(*) FROM kirim_jobs WHERE status IN ('running', 'retry_scheduled');

-- name: deliveries_by_status_doubt
-- Gauges: deliveries per status and doubt (one scan, every few seconds).
SELECT status, doubt, COUNT(*) AS n FROM kirim_deliveries GROUP BY status, doubt;

-- name: due_jobs_summary
-- Gauges: claimable jobs due now, and the run_at of the oldest (the due index).
SELECT COUNT(*) AS n, MIN(run_at) AS oldest FROM kirim_jobs
WHERE status IN ('queued', 'retry_scheduled') AND run_at <= ?;

-- name: delivery_by_id
-- One delivery.
SELECT * FROM kirim_deliveries WHERE id = ?;

-- name: revive_delivery
-- Operator retry: a failed or in-doubt delivery becomes pending; earlier doubt released.
UPDATE kirim_deliveries
SET status = 'pending', doubt = NULL, released_at = ?, last_error = NULL,
    claim_token = NULL, claimed_by = NULL, claim_expires_at = NULL, updated_at = ?
WHERE id = ? AND status IN ('failed', 'in_doubt', 'canceled')
  AND EXISTS (SELECT 1 FROM kirim_jobs j WHERE j.delivery_id = kirim_deliveries.id
              AND j.status = 'dead');

-- name: bury_dead_jobs
-- The dead job is replaced by a fresh one.
UPDATE kirim_jobs SET status = 'completed', last_error = 'retried by operator', updated_at = ?
WHERE delivery_id = ? AND status = 'dead';

-- name: insert_job_for_retry
-- A fresh job with the old job's max_attempts.
INSERT INTO kirim_jobs (delivery_id, status, run_at, max_attempts, created_at, updated_at)
SELECT ?, 'queued', ?, max_attempts, ?, ? FROM kirim_jobs
WHERE delivery_id = ? ORDER BY id DESC LIMIT 1
RETURNING id;

-- name: cancel_delivery
-- Cancel what is neither in flight nor sent (a processing delivery whose claim was
-- revoked by the reaper or at shutdown is not in flight). An earlier request that
-- may have arrived keeps the delivery in doubt: canceled, but perhaps received.
UPDATE kirim_deliveries
SET status = 'canceled', updated_at = :now,
    doubt = CASE WHEN EXISTS (
        SELECT 1 FROM kirim_attempts a
        WHERE a.delivery_id = kirim_deliveries.id AND a.status IN ('requested', 'unknown')
          AND a.requested_at >= COALESCE(kirim_deliveries.released_at, 0))
    THEN COALESCE(doubt, 'held') ELSE doubt END
WHERE id = :delivery_id AND (status IN ('pending', 'failed', 'in_doubt')
                  OR (status = 'processing' AND claim_token IS NULL));

-- name: cancel_jobs
-- Its jobs stop.
UPDATE kirim_jobs
SET status = 'completed', last_error = 'canceled', lease_owner = NULL, lease_token = NULL,
    lease_expires_at = NULL, updated_at = ?
WHERE delivery_id = ? AND status IN ('queued', 'retry_scheduled', 'dead');

-- name: release_job
-- Shutdown: the job goes back to the queue at once (the claim still counts as an attempt).
UPDATE kirim_jobs
SET status = 'queued', run_at = ?, lease_owner = NULL,
    lease_token = NULL, lease_expires_at = NULL, last_error = 'released at shutdown',
    updated_at = ?
WHERE id = ? AND lease_token = ? AND status = 'running';

-- name: release_delivery
-- Shutdown: the claim is revoked now, so the next claimer takes over at once.
UPDATE kirim_deliveries SET claim_token = NULL, claim_expires_at = NULL, updated_at = ?
WHERE id = ? AND claim_token = ? AND status = 'processing';

-- name: search_deliveries
-- The dashboard's search: a delivery id, an idempotency key or an event id (indexed).
SELECT * FROM kirim_deliveries
WHERE id = ? OR idempotency_key = ? OR event_id = ?
ORDER BY id DESC
LIMIT ?;

-- name: insert_token
-- A new API token (its hash); nothing when an active token has the name.
INSERT INTO kirim_tokens (name, token_hash, prefix, created_at)
VALUES (?, ?, ?, ?)
ON CONFLICT DO NOTHING
RETURNING *;

-- name: token_by_hash
-- The active token with this hash.
SELECT * FROM kirim_tokens WHERE token_hash = ? AND revoked_at IS NULL;

-- name: revoke_token_by_name
-- Revoke the active token with this name.
UPDATE kirim_tokens SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL
RETURNING *;

-- name: revoke_token_by_id
-- Revoke the token with this id, if active.
UPDATE kirim_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL
RETURNING *;

-- name: insert_request
-- Take an idempotency key for one HTTP request (nothing when a row exists).
INSERT INTO kirim_requests
    (idempotency_key, fingerprint, state, lock_token, locked_until, created_at, updated_at)
VALUES (?, ?, 'in_progress', ?, ?, ?, ?)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING idempotency_key;

-- name: take_over_request
-- Take over a key whose holder stopped before answering (its hold expired).
UPDATE kirim_requests
SET fingerprint = ?, lock_token = ?, locked_until = ?, updated_at = ?
WHERE idempotency_key = ? AND state = 'in_progress' AND locked_until < ?
RETURNING idempotency_key;

-- name: request_by_key
-- Who holds, or held, an idempotency key.
SELECT * FROM kirim_requests WHERE idempotency_key = ?;

-- name: complete_request
-- Keep the response to replay, while this request still holds the key.
UPDATE kirim_requests
SET state = 'completed', status_code = ?, response = ?, delivery_id = ?, lock_token = NULL,
    locked_until = NULL, updated_at = ?
WHERE idempotency_key = ? AND lock_token = ? AND state = 'in_progress';

-- name: release_request
-- Give the key back (the request failed; an error is not replayed).
DELETE FROM kirim_requests
WHERE idempotency_key = ? AND lock_token = ? AND state = 'in_progress';
