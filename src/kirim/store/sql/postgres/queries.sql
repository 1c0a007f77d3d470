-- Named queries of the PostgreSQL backend (psycopg placeholders: %(name)s).
--
-- Lock order, everywhere: jobs before deliveries (rows of one table in id order),
-- so that claim, intents, finish, reap, cancel and retry never wait on each other in
-- a circle.
--
-- Time: kirim_now(%(now)s) is the time of record (migration 0003): the caller's time
-- when the store was opened with one, else (NULL) the database's own clock. Durations
-- (a lease, a backoff, a send bound) are added to it here, never by the caller.
-- A statement that must see rows committed by a transaction it waited for (an
-- attempt intent, a late success) reads them in a later statement of the same
-- transaction, after the lock: one statement sees one snapshot.

-- name: enqueue
-- Insert deliveries and their jobs; a key that exists is left alone (returned later).
WITH u AS (
    SELECT * FROM unnest(
        %(keys)s::text[], %(event_ids)s::text[], %(recipients)s::text[], %(channels)s::text[],
        %(payloads)s::text[], %(hashes)s::text[], %(run_ats)s::float8[],
        %(max_attempts)s::int[]
    ) WITH ORDINALITY AS u (idempotency_key, event_id, recipient, channel, payload,
                            payload_hash, run_at, max_attempts, idx)
),
firsts AS (
    SELECT DISTINCT ON (idempotency_key) * FROM u ORDER BY idempotency_key, idx
),
ins AS (
    -- Known keys are filtered out first so that they use up no ids (as in SQLite);
    -- ON CONFLICT covers a key inserted concurrently by another transaction.
    INSERT INTO kirim_deliveries
        (idempotency_key, event_id, recipient, channel, payload, payload_hash, status,
         created_at, updated_at)
    SELECT f.idempotency_key, f.event_id, f.recipient, f.channel, f.payload, f.payload_hash,
           'pending', kirim_now(%(now)s::float8), kirim_now(%(now)s::float8)
    FROM firsts f
    WHERE NOT EXISTS (
        SELECT 1 FROM kirim_deliveries d WHERE d.idempotency_key = f.idempotency_key)
    ORDER BY f.idx
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING *
),
jobs AS (
    INSERT INTO kirim_jobs (delivery_id, status, run_at, max_attempts, created_at, updated_at)
    SELECT ins.id, 'queued', COALESCE(f.run_at, kirim_now(%(now)s::float8)), f.max_attempts,
           kirim_now(%(now)s::float8), kirim_now(%(now)s::float8)
    FROM ins JOIN firsts f ON f.idempotency_key = ins.idempotency_key
    ORDER BY ins.id
    RETURNING *
),
woke AS (
    SELECT pg_notify('kirim_jobs', '') FROM (SELECT 1 FROM jobs LIMIT 1) AS any_job
)
-- The new deliveries in id order; their jobs' ids in the same order (one each), on the
-- first row only.
SELECT ins.*,
       CASE WHEN ins.id = (SELECT min(id) FROM ins)
            THEN (SELECT array_agg(id ORDER BY delivery_id) FROM jobs) END AS job_ids,
       (SELECT count(*) FROM woke) AS woke
FROM ins
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

-- name: claim
-- Lease up to `limit` due jobs with fresh tokens and, in the same statement, claim
-- their deliveries (pending, or processing with an expired claim); complete the jobs
-- of final deliveries (noop) and put back the jobs of deliveries claimed by another
-- worker (busy, not counted as an attempt). One row per job, in claim order: the
-- delivery as locked (kind says what happened to it) and the job as leased. Each
-- step reads the one before it and real tables by index, never two CTEs joined.
WITH due AS (
    SELECT id, delivery_id, run_at, attempts, max_attempts, last_error, created_at,
           replace(gen_random_uuid()::text, '-', '') AS token
    FROM kirim_jobs
    WHERE status IN ('queued', 'retry_scheduled') AND run_at <= kirim_now(%(now)s::float8)
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
),
cur AS (
    SELECT d.*,
           CASE
               WHEN d.status = 'pending' THEN 'claimed'
               WHEN d.status = 'processing'
                    AND (d.claim_expires_at IS NULL OR d.claim_expires_at < kirim_now(%(now)s::float8))
                   THEN 'claimed'
               WHEN d.status = 'processing' THEN 'busy'
               ELSE 'noop'
           END AS kind,
           due.id AS job_id, due.run_at AS job_run_at, due.attempts AS attempts_before,
           due.max_attempts AS job_max_attempts, due.last_error AS job_last_error,
           due.created_at AS job_created_at, due.token
    FROM due JOIN kirim_deliveries d ON d.id = due.delivery_id
    ORDER BY d.id
    FOR NO KEY UPDATE OF d
),
leased AS (
    UPDATE kirim_jobs j
    SET status = CASE c.kind WHEN 'claimed' THEN 'running'
                             WHEN 'busy' THEN 'retry_scheduled'
                             ELSE 'completed' END,
        attempts = CASE c.kind WHEN 'busy' THEN j.attempts ELSE j.attempts + 1 END,
        run_at = CASE c.kind WHEN 'busy' THEN COALESCE(c.claim_expires_at, kirim_now(%(now)s::float8))
                             ELSE j.run_at END,
        lease_owner = CASE c.kind WHEN 'claimed' THEN %(worker_id)s::text END,
        lease_token = CASE c.kind WHEN 'claimed' THEN c.token END,
        lease_expires_at = CASE c.kind WHEN 'claimed' THEN (kirim_now(%(now)s::float8) + %(lease)s::float8) END,
        last_error = CASE c.kind WHEN 'noop' THEN 'delivery already ' || c.status
                                 ELSE j.last_error END,
        updated_at = kirim_now(%(now)s::float8)
    FROM cur c
    WHERE j.id = c.job_id
    RETURNING j.id
),
claimed AS (
    UPDATE kirim_deliveries d
    SET status = 'processing', claim_token = c.token, claimed_by = %(worker_id)s::text,
        claim_expires_at = (kirim_now(%(now)s::float8) + %(lease)s::float8), updated_at = kirim_now(%(now)s::float8)
    FROM cur c
    WHERE d.id = c.id AND c.kind = 'claimed'
    RETURNING d.id
)
SELECT c.*,
       c.id AS job_delivery_id, 'running' AS job_status,
       c.attempts_before + 1 AS job_attempts, %(worker_id)s::text AS job_lease_owner,
       c.token AS job_lease_token,
       (kirim_now(%(now)s::float8) + %(lease)s::float8) AS job_lease_expires_at,
       kirim_now(%(now)s::float8) AS job_updated_at, kirim_now(%(now)s::float8) AS db_now,
       (SELECT count(*) FROM leased) AS leased, (SELECT count(*) FROM claimed) AS claimed
FROM cur c
ORDER BY c.job_run_at, c.job_id;

-- name: claim_history
-- After the claim (a new snapshot): per claimed delivery, how many attempt rows it
-- already had (prior_requests, an index-only count), with its attempts that succeeded
-- and those that may have reached the provider since the operator's last release
-- (a delivery with neither gives one row whose attempt columns are NULL).
SELECT c.claimed_id, c.prior_requests, a.*
FROM (
    SELECT d.id AS claimed_id, d.released_at,
           (SELECT count(*) FROM kirim_attempts x WHERE x.delivery_id = d.id)
               AS prior_requests
    FROM kirim_deliveries d
    WHERE d.id = ANY (%(ids)s::bigint[])
) c
LEFT JOIN kirim_attempts a
  ON a.delivery_id = c.claimed_id
 AND (a.status = 'succeeded'
      OR (a.status IN ('requested', 'unknown')
          AND a.requested_at >= COALESCE(c.released_at, 0)))
ORDER BY c.claimed_id, a.id;

-- name: insert_attempts_fenced
-- Write-ahead attempt intents, each only while its claim token holds, bounded in time
-- (no request after send_deadline; none can land after settles_at). FOR SHARE makes a
-- concurrent claim wait for this commit, so that it sees the intent; deliveries are
-- locked in id order, as everywhere.
INSERT INTO kirim_attempts
    (delivery_id, job_id, number, provider_request_id, worker_id, status, requested_at,
     send_deadline, settles_at)
SELECT l.delivery_id, l.job_id, l.number, l.provider_request_id, l.worker_id, 'requested',
       l.t, l.send_deadline, l.settles_at
FROM (
    SELECT u.*, kirim_now(u.requested_at) AS t
    FROM unnest(
        %(delivery_ids)s::bigint[], %(job_ids)s::bigint[], %(tokens)s::text[],
        %(numbers)s::int[], %(request_ids)s::text[], %(worker_ids)s::text[],
        %(requested_ats)s::float8[], %(send_deadlines)s::float8[], %(settles_ats)s::float8[]
    ) AS u (delivery_id, job_id, token, number, provider_request_id, worker_id,
            requested_at, send_deadline, settles_at)
    JOIN kirim_deliveries d
      ON d.id = u.delivery_id AND d.claim_token = u.token AND d.status = 'processing'
    ORDER BY d.id
    FOR SHARE OF d
) l
RETURNING provider_request_id;

-- name: heartbeat
-- Extend job leases, then (forced after them) delivery claims, where tokens hold.
WITH u AS (
    SELECT * FROM unnest(%(job_ids)s::bigint[], %(delivery_ids)s::bigint[], %(tokens)s::text[])
        WITH ORDINALITY AS u (job_id, delivery_id, token, idx)
),
jobs AS (
    UPDATE kirim_jobs j SET lease_expires_at = (kirim_now(%(now)s::float8) + %(lease)s::float8), updated_at = kirim_now(%(now)s::float8)
    FROM u
    WHERE j.id = u.job_id AND j.lease_token = u.token AND j.status = 'running'
    RETURNING j.id, j.lease_token
),
deliveries AS (
    UPDATE kirim_deliveries d SET claim_expires_at = (kirim_now(%(now)s::float8) + %(lease)s::float8)
    FROM u
    WHERE d.id = u.delivery_id AND d.claim_token = u.token
      AND (SELECT count(*) FROM jobs) >= 0
    RETURNING d.id
)
SELECT (u.job_id, u.token) IN (SELECT id, lease_token FROM jobs) AS held,
       (SELECT count(*) FROM deliveries) AS extended
FROM u ORDER BY u.idx;

-- name: finish
-- The common end of many claims at once: attempt outcomes, then (jobs locked first)
-- delivery statuses fenced by the claim token, then the jobs of the deliveries
-- written. A success recorded by any attempt outranks a failure.
WITH given AS (
    SELECT * FROM unnest(
        %(delivery_ids)s::bigint[], %(job_ids)s::bigint[], %(tokens)s::text[],
        %(nows)s::float8[], %(request_ids)s::text[], %(attempt_statuses)s::text[],
        %(attempt_message_ids)s::text[], %(attempt_errors)s::text[],
        %(completed_ats)s::float8[], %(statuses)s::text[], %(doubts)s::text[],
        %(message_ids)s::text[], %(errors)s::text[], %(job_statuses)s::text[],
        %(run_ats)s::float8[], %(delays)s::float8[], %(refunds)s::int[]
    ) WITH ORDINALITY AS u (delivery_id, job_id, token, now, request_id, attempt_status,
                            attempt_message_id, attempt_error, completed_at, status, doubt,
                            message_id, error, job_status, run_at, delay, refund, idx)
),
u AS (
    -- The time of record once, and the next run in it (a backoff is a delay).
    SELECT g.delivery_id, g.job_id, g.token, t.now, g.request_id, g.attempt_status,
           g.attempt_message_id, g.attempt_error, g.completed_at, g.status, g.doubt,
           g.message_id, g.error, g.job_status, COALESCE(g.run_at, t.now + g.delay) AS run_at,
           g.refund, g.idx
    FROM given g CROSS JOIN LATERAL (SELECT kirim_now(g.now) AS now) t
),
locked AS (
    SELECT j.id FROM kirim_jobs j
    WHERE j.id = ANY (ARRAY(
        SELECT job_id FROM u
        UNION
        SELECT k.id FROM u JOIN kirim_jobs k ON k.delivery_id = u.delivery_id
        WHERE k.status IN ('queued', 'running', 'retry_scheduled', 'dead')))
    ORDER BY j.id
    FOR NO KEY UPDATE
),
outcomes AS (
    UPDATE kirim_attempts a
    SET status = u.attempt_status,
        provider_message_id = COALESCE(u.attempt_message_id, a.provider_message_id),
        error = u.attempt_error, completed_at = u.completed_at
    FROM u
    WHERE u.request_id IS NOT NULL AND a.provider_request_id = u.request_id
      AND a.status IN ('requested', 'unknown')
    RETURNING a.id
),
calc AS (
    SELECT u.*,
           CASE WHEN w.found THEN 'sent' ELSE u.status END AS f_status,
           CASE WHEN w.found THEN 'completed' ELSE u.job_status END AS f_job_status,
           CASE WHEN w.found THEN w.provider_message_id ELSE u.message_id END AS f_message_id,
           CASE WHEN w.found AND u.doubt IS NOT NULL THEN 'resolved' ELSE u.doubt END AS f_doubt
    FROM u LEFT JOIN LATERAL (
        SELECT true AS found, a.provider_message_id FROM kirim_attempts a
        WHERE a.delivery_id = u.delivery_id AND a.status = 'succeeded'
          AND u.status <> 'sent'
        ORDER BY a.id LIMIT 1
    ) w ON true
),
written AS (
    UPDATE kirim_deliveries d
    SET status = c.f_status, doubt = c.f_doubt,
        provider_message_id = COALESCE(c.f_message_id, d.provider_message_id),
        last_error = c.error, claim_token = NULL, claimed_by = NULL, claim_expires_at = NULL,
        sent_at = CASE WHEN c.f_status = 'sent' THEN c.now ELSE d.sent_at END,
        updated_at = c.now
    FROM calc c
    WHERE d.id = c.delivery_id AND d.claim_token = c.token
      AND (SELECT count(*) FROM locked) >= 0
    RETURNING d.id, c.job_id, c.token, c.f_job_status, c.run_at, c.error, c.now, c.refund
),
jobs AS (
    UPDATE kirim_jobs j
    SET status = w.f_job_status, run_at = COALESCE(w.run_at, j.run_at), last_error = w.error,
        attempts = j.attempts - w.refund,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = w.now
    FROM written w
    WHERE j.id = w.job_id AND j.lease_token = w.token
    RETURNING j.id
),
late AS (
    -- Stale token, but the attempt succeeded: the delivery is sent all the same.
    SELECT c.delivery_id, c.attempt_message_id, c.now FROM calc c
    WHERE c.attempt_status = 'succeeded' AND c.delivery_id NOT IN (SELECT id FROM written)
),
late_deliveries AS (
    UPDATE kirim_deliveries d
    SET status = 'sent',
        provider_message_id = COALESCE(d.provider_message_id, l.attempt_message_id),
        doubt = CASE WHEN d.doubt IS NULL THEN NULL ELSE 'resolved' END,
        claim_token = NULL, claimed_by = NULL, claim_expires_at = NULL,
        sent_at = COALESCE(d.sent_at, l.now), updated_at = l.now
    FROM late l
    WHERE d.id = l.delivery_id
    RETURNING d.id
),
late_jobs AS (
    UPDATE kirim_jobs j
    SET status = 'completed', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        last_error = 'completed by a late success', updated_at = l.now
    FROM late l
    WHERE j.delivery_id = l.delivery_id
      AND j.status IN ('queued', 'running', 'retry_scheduled', 'dead')
    RETURNING j.id
)
SELECT c.idx, c.f_status, c.f_job_status,
       c.delivery_id IN (SELECT id FROM written) AS committed,
       (SELECT count(*) FROM outcomes) AS outcomes, (SELECT count(*) FROM jobs) AS jobs,
       (SELECT count(*) FROM late_deliveries) AS late_deliveries,
       (SELECT count(*) FROM late_jobs) AS late_jobs
FROM calc c
ORDER BY c.idx;

-- name: lock_job
-- Jobs before deliveries: the job a per-item finish is about.
SELECT id FROM kirim_jobs WHERE id = %(job_id)s OR delivery_id = %(delivery_id)s
ORDER BY id FOR NO KEY UPDATE;

-- name: complete_attempt
-- Record a request's outcome; a fact is recorded whatever the claim's fate.
UPDATE kirim_attempts
SET status = %(status)s, provider_message_id = COALESCE(%(message_id)s, provider_message_id),
    error = %(error)s, completed_at = %(completed_at)s::float8
WHERE provider_request_id = %(request_id)s AND status IN ('requested', 'unknown');

-- name: succeeded_attempt
-- Any attempt of the delivery that succeeded.
SELECT provider_message_id FROM kirim_attempts
WHERE delivery_id = %(delivery_id)s AND status = 'succeeded'
ORDER BY id LIMIT 1;

-- name: finish_delivery
-- Write the delivery's new status, fenced by the claim token; releases the claim.
UPDATE kirim_deliveries
SET status = %(status)s, doubt = %(doubt)s,
    provider_message_id = COALESCE(%(message_id)s, provider_message_id),
    last_error = %(error)s, claim_token = NULL, claimed_by = NULL, claim_expires_at = NULL,
    sent_at = CASE WHEN %(status)s = 'sent' THEN kirim_now(%(now)s::float8)
                   ELSE sent_at END,
    updated_at = kirim_now(%(now)s::float8)
WHERE id = %(delivery_id)s AND claim_token = %(token)s;

-- name: finish_job
-- Write the job's new state, fenced by the lease token; releases the lease (and gives
-- the claim back when it only waited for doubt to settle). The next run: a time of
-- record, or a delay from now.
UPDATE kirim_jobs
SET status = %(status)s,
    run_at = COALESCE(%(run_at)s::float8, kirim_now(%(now)s::float8) + %(delay)s::float8, run_at),
    last_error = %(error)s, attempts = attempts - %(refund)s::int,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    updated_at = kirim_now(%(now)s::float8)
WHERE id = %(job_id)s AND lease_token = %(token)s;

-- name: doubtful_attempts
-- Attempts that may have reached the provider, since the operator's last release.
SELECT a.* FROM kirim_attempts a JOIN kirim_deliveries d ON d.id = a.delivery_id
WHERE a.delivery_id = %(delivery_id)s AND a.status IN ('requested', 'unknown')
  AND a.requested_at >= COALESCE(d.released_at, 0)
ORDER BY a.id;

-- name: store_now
-- The time of record.
SELECT kirim_now(%(now)s::float8) AS now;

-- name: reopen_delivery
-- A late definite failure withdrew an assumption: pending again, or failed.
UPDATE kirim_deliveries
SET status = %(status)s, doubt = 'resolved', last_error = %(error)s, claim_token = NULL,
    claimed_by = NULL, claim_expires_at = NULL, sent_at = NULL, provider_message_id = NULL,
    updated_at = kirim_now(%(now)s::float8)
WHERE id = %(delivery_id)s;

-- name: reopen_job
-- ... and its latest job runs again (retry_scheduled), or is a dead letter.
UPDATE kirim_jobs
SET status = %(status)s, run_at = kirim_now(%(now)s::float8) + %(delay)s::float8,
    last_error = %(error)s, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    updated_at = kirim_now(%(now)s::float8)
WHERE id = %(job_id)s AND status IN ('completed', 'dead');

-- name: late_success_delivery
-- A success reported after the claim was lost still makes the delivery sent.
UPDATE kirim_deliveries
SET status = 'sent', provider_message_id = COALESCE(provider_message_id, %(message_id)s),
    doubt = CASE WHEN doubt IS NULL THEN NULL ELSE 'resolved' END,
    claim_token = NULL, claimed_by = NULL, claim_expires_at = NULL,
    sent_at = COALESCE(sent_at, kirim_now(%(now)s::float8)), updated_at = kirim_now(%(now)s::float8)
WHERE id = %(delivery_id)s
RETURNING *;

-- name: late_success_jobs
-- ... and ends whatever job still carries it.
UPDATE kirim_jobs
SET status = 'completed', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    last_error = 'completed by a late success', updated_at = kirim_now(%(now)s::float8)
WHERE delivery_id = %(delivery_id)s
  AND status IN ('queued', 'running', 'retry_scheduled', 'dead');

-- name: reap
-- Running jobs whose lease expired go back to the queue (their delivery claims revoked),
-- or die on their final attempt (their deliveries are parked by a later statement).
WITH expired AS (
    SELECT id, delivery_id, attempts, max_attempts, lease_owner, lease_token,
           lease_expires_at, attempts >= max_attempts AS dead
    FROM kirim_jobs
    WHERE status = 'running' AND lease_expires_at < kirim_now(%(now)s::float8)
    ORDER BY lease_expires_at, id
    LIMIT 1000
    FOR NO KEY UPDATE SKIP LOCKED
),
done AS (
    UPDATE kirim_jobs j
    SET status = CASE WHEN e.dead THEN 'dead' ELSE 'queued' END,
        run_at = CASE WHEN e.dead THEN j.run_at ELSE kirim_now(%(now)s::float8) END,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        last_error = CASE WHEN e.dead THEN 'lease expired on the final attempt'
                          ELSE 'lease expired' END,
        updated_at = kirim_now(%(now)s::float8)
    FROM expired e
    WHERE j.id = e.id AND j.lease_token = e.lease_token
    RETURNING j.id
),
revoked AS (
    -- The expired holder's token stops working: its intent or late status write is
    -- refused (an intent in flight holds FOR SHARE: this waits for it).
    UPDATE kirim_deliveries d
    SET claim_token = NULL, claim_expires_at = NULL, updated_at = kirim_now(%(now)s::float8)
    FROM expired e
    WHERE NOT e.dead AND d.id = e.delivery_id AND d.claim_token = e.lease_token
      AND d.status = 'processing'
      AND (SELECT count(*) FROM done) >= 0
    RETURNING d.id
)
SELECT e.*, (SELECT count(*) FROM done) AS done, (SELECT count(*) FROM revoked) AS revoked,
       (SELECT d.channel FROM kirim_deliveries d WHERE d.id = e.delivery_id) AS channel
FROM expired e ORDER BY e.lease_expires_at, e.id;

-- name: lock_deliveries
-- Wait for in-flight intents on these deliveries before reading their attempts.
SELECT id FROM kirim_deliveries WHERE id = ANY (%(ids)s::bigint[])
ORDER BY id FOR NO KEY UPDATE;

-- name: park_expired_deliveries
-- Deliveries of jobs that died with their lease: in doubt if a request may have left.
UPDATE kirim_deliveries d
SET status = CASE WHEN x.doubtful THEN 'in_doubt' ELSE 'failed' END,
    doubt = CASE WHEN x.doubtful THEN 'held' ELSE d.doubt END,
    last_error = 'lease expired on the final attempt',
    claim_token = NULL, claimed_by = NULL, claim_expires_at = NULL,
    updated_at = kirim_now(%(now)s::float8)
FROM (
    SELECT u.id, u.token, EXISTS (
        SELECT 1 FROM kirim_attempts a JOIN kirim_deliveries dd ON dd.id = a.delivery_id
        WHERE a.delivery_id = u.id AND a.status IN ('requested', 'unknown')
          AND a.requested_at >= COALESCE(dd.released_at, 0)) AS doubtful
    FROM unnest(%(ids)s::bigint[], %(tokens)s::text[]) AS u (id, token)
) x
WHERE d.id = x.id AND d.claim_token = x.token AND d.status = 'processing';

-- name: release_jobs
-- Shutdown: the jobs go back to the queue at once (the claim still counts as an attempt).
UPDATE kirim_jobs j
SET status = 'queued', run_at = kirim_now(%(now)s::float8), lease_owner = NULL, lease_token = NULL,
    lease_expires_at = NULL, last_error = 'released at shutdown', updated_at = kirim_now(%(now)s::float8)
FROM unnest(%(job_ids)s::bigint[], %(tokens)s::text[]) AS u (id, token)
WHERE j.id = u.id AND j.lease_token = u.token AND j.status = 'running';

-- name: release_deliveries
-- Shutdown: the claims are revoked now, so the next claimer takes over at once.
UPDATE kirim_deliveries d
SET claim_token = NULL, claim_expires_at = NULL, updated_at = kirim_now(%(now)s::float8)
FROM unnest(%(delivery_ids)s::bigint[], %(tokens)s::text[]) AS u (id, token)
WHERE d.id = u.id AND d.claim_token = u.token AND d.status = 'processing';

-- name: notify
-- Wake the workers that listen (delivered at commit).
SELECT pg_notify('kirim_jobs', '');

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

-- name: dead_jobs
-- Dead letters, oldest first.
SELECT * FROM kirim_jobs WHERE status = 'dead' ORDER BY id LIMIT %(limit)s;

-- name: deliveries_by_ids
-- Deliveries by id.
SELECT * FROM kirim_deliveries WHERE id = ANY (%(ids)s::bigint[]);

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

-- name: lock_delivery_jobs
-- Jobs before deliveries: every job of one delivery.
SELECT id FROM kirim_jobs WHERE delivery_id = %(delivery_id)s ORDER BY id FOR NO KEY UPDATE;

-- name: revive_delivery
-- Operator retry: a failed or in-doubt delivery becomes pending; earlier doubt released.
UPDATE kirim_deliveries
SET status = 'pending', doubt = NULL, released_at = kirim_now(%(now)s::float8), last_error = NULL,
    claim_token = NULL, claimed_by = NULL, claim_expires_at = NULL,
    updated_at = kirim_now(%(now)s::float8)
WHERE id = %(delivery_id)s AND status IN ('failed', 'in_doubt', 'canceled')
  AND EXISTS (SELECT 1 FROM kirim_jobs j WHERE j.delivery_id = kirim_deliveries.id
              AND j.status = 'dead');

-- name: bury_dead_jobs
-- The dead job is replaced by a fresh one.
UPDATE kirim_jobs
SET status = 'completed', last_error = 'retried by operator', updated_at = kirim_now(%(now)s::float8)
WHERE delivery_id = %(delivery_id)s AND status = 'dead';

-- name: insert_job_for_retry
-- A fresh job with the old job's max_attempts.
INSERT INTO kirim_jobs (delivery_id, status, run_at, max_attempts, created_at, updated_at)
SELECT %(delivery_id)s, 'queued', kirim_now(%(now)s::float8), max_attempts, kirim_now(%(now)s::float8),
       kirim_now(%(now)s::float8)
FROM kirim_jobs
WHERE delivery_id = %(delivery_id)s ORDER BY id DESC LIMIT 1
RETURNING id;

-- name: cancel_delivery
-- Cancel what is neither in flight nor sent (a processing delivery whose claim was
-- revoked by the reaper or at shutdown is not in flight).
UPDATE kirim_deliveries
SET status = 'canceled', updated_at = kirim_now(%(now)s::float8),
    doubt = CASE WHEN EXISTS (
        SELECT 1 FROM kirim_attempts a
        WHERE a.delivery_id = kirim_deliveries.id AND a.status IN ('requested', 'unknown')
          AND a.requested_at >= COALESCE(kirim_deliveries.released_at, 0))
    THEN COALESCE(doubt, 'held') ELSE doubt END
WHERE id = %(delivery_id)s
  AND (status IN ('pending', 'failed', 'in_doubt')
       OR (status = 'processing' AND claim_token IS NULL));

-- name: cancel_jobs
-- Its jobs stop.
UPDATE kirim_jobs
SET status = 'completed', last_error = 'canceled', lease_owner = NULL, lease_token = NULL,
    lease_expires_at = NULL, updated_at = kirim_now(%(now)s::float8)
WHERE delivery_id = %(delivery_id)s AND status IN ('queued', 'retry_scheduled', 'dead');

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
-- Keep the responses to replay, where each request still holds its key.
UPDATE kirim_requests r
SET state = 'completed', status_code = u.status_code, response = u.response,
    delivery_id = u.delivery_id, lock_token = NULL, locked_until = NULL,
    updated_at = kirim_now(%(now)s::float8)
FROM unnest(%(keys)s::text[], %(tokens)s::text[], %(codes)s::int[], %(responses)s::text[],
            %(delivery_ids)s::bigint[])
     AS u (idempotency_key, lock_token, status_code, response, delivery_id)
WHERE r.idempotency_key = u.idempotency_key AND r.lock_token = u.lock_token
  AND r.state = 'in_progress';

-- name: release_requests
-- Give the keys back (the requests failed; an error is not replayed).
DELETE FROM kirim_requests r
USING unnest(%(keys)s::text[], %(tokens)s::text[]) AS u (idempotency_key, lock_token)
WHERE r.idempotency_key = u.idempotency_key AND r.lock_token = u.lock_token
  AND r.state = 'in_progress';
