-- The data access of the ledger's transitions (kirim.store.transitions), SQLite.
--
-- These statements only read and write rows: every decision is made in Python, once
-- for both backends (claim_fresh claims only the deliveries for which
-- transitions.claim has nothing to decide, and writes what it would write; the
-- finish_fenced_ statements write only the finishes whose fences hold, what
-- transitions.finish would write for them). A set of
-- ids is one JSON parameter (:ids, read with json_each). A set of records (:items) is
-- either one JSON parameter too (a query that names :items, `value ->> 'column'`),
-- or, for a query that does not, one run of the statement per record (executemany:
-- each record's columns are its parameters), which is faster in SQLite than taking a
-- JSON text apart column by column. Every write runs inside BEGIN IMMEDIATE: the
-- database's write lock is held from the first read, so the rows read cannot change
-- before the commit (the "lock_" queries only read, here).

-- name: due_jobs
-- Up to :limit claimable jobs that are due, oldest first, each with its delivery.
SELECT d.*,
       j.id AS job_id, j.delivery_id AS job_delivery_id, j.status AS job_status,
       j.run_at AS job_run_at, j.attempts AS job_attempts, j.max_attempts AS job_max_attempts,
       j.lease_owner AS job_lease_owner, j.lease_token AS job_lease_token,
       j.lease_expires_at AS job_lease_expires_at, j.last_error AS job_last_error,
       j.created_at AS job_created_at, j.updated_at AS job_updated_at
FROM (SELECT * FROM kirim_jobs
      WHERE status IN ('queued', 'retry_scheduled') AND run_at <= :now
      ORDER BY run_at, id
      LIMIT coalesce(:limit, -1)) AS j
JOIN kirim_deliveries d ON d.id = j.delivery_id
ORDER BY j.run_at, j.id;

-- name: claim_fresh
-- The claim of the fresh deliveries among up to :limit due jobs (transitions.claim):
-- a delivery pending, with no attempt, of no type whose recipients' preferences are
-- checked at the claim (:checked_types), is claimed by :worker_id under a fresh token
-- (16 random bytes, 32 hexadecimal digits). What it writes is what transitions.claim
-- writes for such a row (claim_rows.processing_columns); claim_fresh_jobs then leases
-- their jobs (one table per statement). The due jobs it passes over are left to
-- due_jobs, in the same transaction. Returns the deliveries as written.
UPDATE kirim_deliveries
SET status = 'processing', claim_token = lower(hex(randomblob(16))),
    claimed_by = :worker_id, claim_expires_at = :now + :lease, updated_at = :now
WHERE id IN (SELECT delivery_id FROM kirim_jobs
             WHERE status IN ('queued', 'retry_scheduled') AND run_at <= :now
             ORDER BY run_at, id
             LIMIT :limit)
  AND status = 'pending'
  AND (type IS NULL OR type NOT IN (SELECT value FROM json_each(:checked_types)))
  AND NOT EXISTS (SELECT 1 FROM kirim_attempts a WHERE a.delivery_id = kirim_deliveries.id)
RETURNING *;

-- name: claim_fresh_jobs
-- ... and the due jobs of the deliveries it claimed (:ids), leased under each
-- delivery's claim token (claim_rows.leased_job_columns). Returns the jobs as written.
UPDATE kirim_jobs
SET status = 'running', attempts = attempts + 1, lease_owner = :worker_id,
    lease_token = d.claim_token, lease_expires_at = :now + :lease, updated_at = :now
FROM kirim_deliveries AS d
WHERE kirim_jobs.delivery_id IN (SELECT value FROM json_each(:ids))
  AND kirim_jobs.status IN ('queued', 'retry_scheduled')
  AND d.id = kirim_jobs.delivery_id
RETURNING kirim_jobs.id, kirim_jobs.delivery_id, kirim_jobs.status, kirim_jobs.run_at,
    kirim_jobs.attempts, kirim_jobs.max_attempts, kirim_jobs.lease_owner,
    kirim_jobs.lease_token, kirim_jobs.lease_expires_at, kirim_jobs.last_error,
    kirim_jobs.created_at, kirim_jobs.updated_at;

-- name: claim_history
-- Per delivery about to be claimed: how many attempt rows it already had, with every
-- one of its attempts (the failover route and the in-doubt policy read them; one row
-- with NULL attempt columns when it has none).
SELECT c.claimed_id, c.prior_requests, a.*
FROM (
    SELECT d.id AS claimed_id,
           (SELECT COUNT(*) FROM kirim_attempts x WHERE x.delivery_id = d.id)
               AS prior_requests
    FROM kirim_deliveries d
    WHERE d.id IN (SELECT value FROM json_each(:ids))
) c
LEFT JOIN kirim_attempts a ON a.delivery_id = c.claimed_id
ORDER BY c.claimed_id, a.id;

-- name: lock_jobs
-- The jobs of these deliveries, and these jobs.
SELECT * FROM kirim_jobs
WHERE delivery_id IN (SELECT value FROM json_each(:delivery_ids))
   OR id IN (SELECT value FROM json_each(:job_ids))
ORDER BY id;

-- name: lock_deliveries
-- These deliveries.
SELECT * FROM kirim_deliveries WHERE id IN (SELECT value FROM json_each(:ids)) ORDER BY id;

-- name: attempts_of_deliveries
-- Every attempt of these deliveries.
SELECT * FROM kirim_attempts
WHERE delivery_id IN (SELECT value FROM json_each(:ids))
ORDER BY delivery_id, id;

-- name: expired_jobs
-- Running jobs whose lease expired (with their delivery's channel, for metrics).
SELECT j.*, (SELECT d.channel FROM kirim_deliveries d WHERE d.id = j.delivery_id) AS channel
FROM kirim_jobs j
WHERE j.status = 'running' AND j.lease_expires_at < :now
ORDER BY j.lease_expires_at, j.id
LIMIT 1000;

-- name: write_attempts
-- Outcomes of requests (one statement run for each item: executemany); one already
-- settled never changes.
UPDATE kirim_attempts
SET status = :status, provider_message_id = :message_id, error = :error,
    completed_at = :completed_at
WHERE provider_request_id = :request_id AND status IN ('requested', 'unknown');

-- name: write_deliveries
-- Deliveries as the transition left them (executemany).
UPDATE kirim_deliveries
SET status = :status, doubt = :doubt, claim_token = :claim_token, claimed_by = :claimed_by,
    claim_expires_at = :claim_expires_at, provider_message_id = :provider_message_id,
    last_error = :last_error, sent_at = :sent_at, released_at = :released_at,
    reason = :reason, updated_at = :updated_at
WHERE id = :id;

-- name: write_jobs
-- Jobs as the transition left them (executemany).
UPDATE kirim_jobs
SET status = :status, run_at = :run_at, attempts = :attempts, lease_owner = :lease_owner,
    lease_token = :lease_token, lease_expires_at = :lease_expires_at,
    last_error = :last_error, updated_at = :updated_at
WHERE id = :id;

-- name: finish_fenced_jobs
-- The plain finish of a batch (transitions.finish_fenced_first), all or none: each
-- item's job (executemany), written only where the claim's token still holds on the
-- job and on its delivery, and no success recorded by any attempt outranks a
-- failure. The transaction holds the database's write lock, so what these statements
-- check cannot change between them; a statement that writes fewer rows than it was
-- given (a claim lost, an outcome already settled) has the transaction rolled back,
-- and the batch goes the careful way. PostgreSQL's one statement writes what it can
-- and returns it; records, bound by position, cost SQLite less than a JSON text taken
-- apart column by column. The columns written are rules.job_committed_columns'.
UPDATE kirim_jobs
SET status = :job_status, run_at = coalesce(:run_at, :now + :delay, run_at),
    last_error = :error, lease_owner = NULL, lease_token = NULL,
    lease_expires_at = NULL, updated_at = :now
WHERE id = :job_id AND delivery_id = :delivery_id AND lease_token = :token
  AND status = 'running'
  AND EXISTS (SELECT 1 FROM kirim_deliveries d
              WHERE d.id = :delivery_id AND d.claim_token = :token
                AND d.status = 'processing')
  AND (:status = 'sent'
       OR NOT EXISTS (SELECT 1 FROM kirim_attempts s
                      WHERE s.delivery_id = :delivery_id AND s.status = 'succeeded'));

-- name: finish_fenced_deliveries
-- ... their deliveries, under the same fence (rules.committed_columns) ...
UPDATE kirim_deliveries
SET status = :status, doubt = NULL, claim_token = NULL, claimed_by = NULL,
    claim_expires_at = NULL, provider_message_id = coalesce(:message_id, provider_message_id),
    last_error = :error,
    sent_at = CASE WHEN :status = 'sent' THEN :now ELSE sent_at END,
    reason = coalesce(:reason, reason), updated_at = :now
WHERE id = :delivery_id AND claim_token = :token AND status = 'processing';

-- name: finish_fenced_attempts
-- ... their requests' outcomes (each still open: one already settled has the batch go
-- the careful way, which leaves it as it is) ...
UPDATE kirim_attempts
SET status = :outcome,
    provider_message_id = coalesce(:outcome_message_id, provider_message_id),
    error = :outcome_error, completed_at = :completed_at
WHERE provider_request_id = :request_id AND delivery_id = :delivery_id
  AND status IN ('requested', 'unknown');

-- name: finish_fenced_message_ids
-- ... and the provider message ids the deliveries (:ids) and the attempts
-- (:request_ids) now hold, each pair once (callback_find reads them).
INSERT OR IGNORE INTO kirim_message_ids (delivery_id, message_id)
SELECT id, provider_message_id FROM kirim_deliveries
WHERE id IN (SELECT value FROM json_each(:ids)) AND provider_message_id IS NOT NULL
UNION
SELECT delivery_id, provider_message_id FROM kirim_attempts
WHERE provider_request_id IN (SELECT value FROM json_each(:request_ids))
  AND provider_message_id IS NOT NULL;

-- name: insert_jobs
-- New jobs (an operator's retry; executemany).
INSERT INTO kirim_jobs (delivery_id, status, run_at, max_attempts, created_at, updated_at)
VALUES (:delivery_id, 'queued', :run_at, :max_attempts, :now, :now);

-- name: insert_intents
-- Write-ahead attempt intents (executemany), each only while its claim token holds (the
-- fence), bounded in time: no request after send_deadline, none can land after
-- settles_at; provider: the channel the request goes to (failover).
INSERT INTO kirim_attempts
    (delivery_id, job_id, number, provider_request_id, worker_id, status, requested_at,
     send_deadline, settles_at, provider)
SELECT :delivery_id, :job_id, :number, :request_id, :worker_id, 'requested', :requested_at,
       :send_deadline, :settles_at, :provider
WHERE EXISTS (SELECT 1 FROM kirim_deliveries
              WHERE id = :delivery_id AND claim_token = :token AND status = 'processing');

-- name: intents_written
-- Which of these requests have an attempt row (after insert_intents wrote fewer rows
-- than it was given: some claims were lost).
SELECT provider_request_id FROM kirim_attempts
WHERE provider_request_id IN (SELECT value FROM json_each(:request_ids));

-- name: extend_leases
-- Heartbeat: extend job leases where the lease token holds.
UPDATE kirim_jobs AS j SET lease_expires_at = :until, updated_at = :now
FROM json_each(:items) AS u
WHERE j.id = u.value ->> 'job_id' AND j.lease_token = u.value ->> 'token'
  AND j.status = 'running'
RETURNING id, lease_token;

-- name: extend_claims
-- ... and delivery claims where the claim token holds.
UPDATE kirim_deliveries AS d SET claim_expires_at = :until
FROM json_each(:items) AS u
WHERE d.id = u.value ->> 'delivery_id' AND d.claim_token = u.value ->> 'token';
