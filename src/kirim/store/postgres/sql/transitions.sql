-- The data access of the ledger's transitions (kirim.store.transitions), PostgreSQL.
--
-- These statements only read and write rows: every decision is made in Python, once
-- for both backends (claim_fresh claims only the deliveries for which
-- transitions.claim has nothing to decide, and writes what it would write). A set is
-- one parameter per column: %(ids)s an array of ids; the records of a step's items
-- arrive as one array per column, %(i_<column>)s (unnest).
-- Times are the transaction's time of record, given (%(now)s).
--
-- Lock order, everywhere: jobs before deliveries, each table in id order, so that
-- claims, intents, finishes, reaps and the operator's verbs never wait in a circle. A
-- statement that must see rows committed by a transaction it waited for (an intent, a
-- late success) reads them in a later statement of the same transaction, after the
-- lock: one statement sees one snapshot.
--
-- Index lookups at any table size: a set of rows is named by `= ANY (array)` on an
-- indexed column (the primary key, the request id), also where the statement joins the
-- set's records (unnest), so that the planner takes the index whatever its statistics
-- say (a hash join over a scan of the whole table would cost a batch the table's size).
-- The batch drives: its records are read once (a LATERAL lookup per item, or the
-- states a fence compares carried by the batch's rows, not filters on the table), so
-- no plan reads them again per row; the claim's and the careful transitions'
-- transactions plan by index alone (plan_by_index). docs/design.md, "Plans that do
-- not trust the statistics".

-- name: plan_by_index
-- The transaction plans by index alone from here on (SET LOCAL: this transaction
-- only, so a pooler's shared session keeps its settings): the claim's and the careful
-- transitions' statements (transitions._read) read a batch by key and the due jobs in
-- claim order, and the statistics cannot be trusted to say so. A queue that filled
-- since the last ANALYZE (a new ledger's first burst, a backlog after an outage)
-- looks empty to them, and the planner then sorted every due job to take the first
-- batch (each claim cost the backlog's size), or scanned a table it believed small.
SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true);

-- name: due_jobs
-- Lock up to %(limit)s due jobs (skipping those another claim holds), oldest first,
-- then their deliveries in id order (the rows are sorted, then locked); one row per
-- job with its delivery. The due jobs drive: each delivery is looked up by key from
-- its job. (A filter naming the deliveries by an array of the due jobs' ids let the
-- planner, under statistics that believe no job is due, read the deliveries first and
-- the due jobs again for each: 65,536 rows for a batch of 256, 20 ms of its 21.)
WITH due AS (
    SELECT * FROM kirim_jobs
    WHERE status IN ('queued', 'retry_scheduled') AND run_at <= %(now)s::float8
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
)
SELECT d.*,
       j.id AS job_id, j.delivery_id AS job_delivery_id, j.status AS job_status,
       j.run_at AS job_run_at, j.attempts AS job_attempts, j.max_attempts AS job_max_attempts,
       j.lease_owner AS job_lease_owner, j.lease_token AS job_lease_token,
       j.lease_expires_at AS job_lease_expires_at, j.last_error AS job_last_error,
       j.created_at AS job_created_at, j.updated_at AS job_updated_at
FROM due j JOIN kirim_deliveries d ON d.id = j.delivery_id
ORDER BY d.id
FOR NO KEY UPDATE OF d;

-- name: claim_fresh
-- The claim of the fresh deliveries among up to %(limit)s due jobs, one statement
-- (transitions.claim): a due job whose delivery is pending, has no attempt and is of
-- no type whose recipients' preferences are checked at the claim (%(checked_types)s)
-- is leased to %(worker_id)s and its delivery claimed, under a fresh token (a random
-- UUID's 32 hexadecimal digits: keys.new_token's form); the others stay locked for the
-- rest of the claim's transaction (due_jobs takes them: its SKIP LOCKED does not skip
-- this transaction's own locks). What it writes is what transitions.claim writes for
-- such a row (claim_rows.processing_columns, claim_rows.leased_job_columns): no earlier
-- request, history, success nor preference to read, so nothing to decide.
-- Lock order: the jobs first (SKIP LOCKED: never waits), then the deliveries in id
-- order (= ANY of the array: the primary key's order), then the jobs already held. The
-- batch drives: the deliveries are named by key, each job is looked up by its
-- delivery's (its one active job), and the claimed rows come back from the jobs'
-- update, so no plan joins two of the batch's sets (a join of two, under statistics
-- that believe none is pending, read one again for each row of the other: n squared).
-- Returns the claimed rows as due_jobs does (the delivery's columns and its job's,
-- job_-prefixed), as written.
WITH due AS (
    SELECT j.delivery_id FROM kirim_jobs j
    WHERE j.status IN ('queued', 'retry_scheduled')
      AND j.run_at <= kirim_now(%(now)s::float8)
    ORDER BY j.run_at, j.id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
),
d AS (
    UPDATE kirim_deliveries d
    SET status = 'processing', claim_token = replace(gen_random_uuid()::text, '-', ''),
        claimed_by = %(worker_id)s,
        claim_expires_at = kirim_now(%(now)s::float8) + %(lease)s::float8,
        updated_at = kirim_now(%(now)s::float8)
    WHERE d.id = ANY (ARRAY(SELECT delivery_id FROM due))
      AND d.status = 'pending'
      AND (d.type IS NULL OR d.type <> ALL (%(checked_types)s::text[]))
      -- no attempt: looked up per delivery (a scalar subquery is never made a join, which
      -- statistics that believe the attempts few made a merge over all of them)
      AND (SELECT a.id FROM kirim_attempts a WHERE a.delivery_id = d.id LIMIT 1) IS NULL
    -- the job states a due job has, carried by the rows (a condition of the join below,
    -- not a filter on the jobs: a filter let the planner read every due job and join
    -- the claimed deliveries to each, n squared, where statistics believe few are due)
    RETURNING d.*, '{queued,retry_scheduled}'::text[] AS due_states
),
j AS (
    UPDATE kirim_jobs j
    SET status = 'running', attempts = j.attempts + 1, lease_owner = d.claimed_by,
        lease_token = d.claim_token, lease_expires_at = d.claim_expires_at,
        updated_at = d.updated_at
    FROM d
    WHERE j.delivery_id = d.id AND j.status = ANY (d.due_states)
    RETURNING d.*,
       j.id AS job_id, j.delivery_id AS job_delivery_id, j.status AS job_status,
       j.run_at AS job_run_at, j.attempts AS job_attempts, j.max_attempts AS job_max_attempts,
       j.lease_owner AS job_lease_owner, j.lease_token AS job_lease_token,
       j.lease_expires_at AS job_lease_expires_at, j.last_error AS job_last_error,
       j.created_at AS job_created_at, j.updated_at AS job_updated_at
)
SELECT * FROM j;

-- name: claim_history
-- After the claim's locks (a new snapshot): per delivery about to be claimed, how many
-- attempt rows it already had, with every one of its attempts (the failover route
-- and the in-doubt policy read them; one row with NULL attempt columns when it has
-- none).
SELECT c.claimed_id, c.prior_requests, a.*
FROM (
    SELECT d.id AS claimed_id,
           (SELECT count(*) FROM kirim_attempts x WHERE x.delivery_id = d.id)
               AS prior_requests
    FROM kirim_deliveries d
    WHERE d.id = ANY (%(ids)s::bigint[])
) c
LEFT JOIN kirim_attempts a
  ON a.delivery_id = c.claimed_id AND a.delivery_id = ANY (%(ids)s::bigint[])
ORDER BY c.claimed_id, a.id;

-- name: lock_jobs
-- Lock the jobs of these deliveries, and these jobs.
SELECT * FROM kirim_jobs
WHERE id = ANY (ARRAY(SELECT k.id FROM kirim_jobs k
                      WHERE k.delivery_id = ANY (%(delivery_ids)s::bigint[]))
                || %(job_ids)s::bigint[])
ORDER BY id
FOR NO KEY UPDATE;

-- name: lock_deliveries
-- Lock these deliveries (waits for intents in flight on them).
SELECT * FROM kirim_deliveries WHERE id = ANY (%(ids)s::bigint[])
ORDER BY id
FOR NO KEY UPDATE;

-- name: attempts_of_deliveries
-- Every attempt of these deliveries.
SELECT * FROM kirim_attempts WHERE delivery_id = ANY (%(ids)s::bigint[])
ORDER BY delivery_id, id;

-- name: expired_jobs
-- Lock running jobs whose lease expired (skipping those locked), with their channel.
SELECT j.*, (SELECT d.channel FROM kirim_deliveries d WHERE d.id = j.delivery_id) AS channel
FROM kirim_jobs j
WHERE j.status = 'running' AND j.lease_expires_at < %(now)s::float8
ORDER BY j.lease_expires_at, j.id
LIMIT 1000
FOR NO KEY UPDATE OF j SKIP LOCKED;

-- name: write_attempts
-- Outcomes of requests; one already settled never changes.
UPDATE kirim_attempts a
SET status = u.status, provider_message_id = u.message_id, error = u.error,
    completed_at = u.completed_at
FROM unnest(
    %(i_request_id)s::text[], %(i_status)s::text[], %(i_message_id)s::text[],
    %(i_error)s::text[], %(i_completed_at)s::float8[]
) AS u (request_id, status, message_id, error, completed_at)
WHERE a.provider_request_id = u.request_id AND a.status IN ('requested', 'unknown')
  AND a.provider_request_id = ANY (%(i_request_id)s::text[]);

-- name: write_deliveries
-- Deliveries as the transition left them.
UPDATE kirim_deliveries d
SET status = u.status, doubt = u.doubt, claim_token = u.claim_token,
    claimed_by = u.claimed_by, claim_expires_at = u.claim_expires_at,
    provider_message_id = u.provider_message_id, last_error = u.last_error,
    sent_at = u.sent_at, released_at = u.released_at, reason = u.reason,
    updated_at = u.updated_at
FROM unnest(
    %(i_id)s::bigint[], %(i_status)s::text[], %(i_doubt)s::text[],
    %(i_claim_token)s::text[], %(i_claimed_by)s::text[],
    %(i_claim_expires_at)s::float8[], %(i_provider_message_id)s::text[],
    %(i_last_error)s::text[], %(i_sent_at)s::float8[], %(i_released_at)s::float8[],
    %(i_reason)s::text[], %(i_updated_at)s::float8[]
) AS u (id, status, doubt, claim_token, claimed_by, claim_expires_at,
    provider_message_id, last_error, sent_at, released_at, reason, updated_at)
WHERE d.id = u.id AND d.id = ANY (%(i_id)s::bigint[]);

-- name: write_jobs
-- Jobs as the transition left them.
UPDATE kirim_jobs j
SET status = u.status, run_at = u.run_at, attempts = u.attempts,
    lease_owner = u.lease_owner, lease_token = u.lease_token,
    lease_expires_at = u.lease_expires_at, last_error = u.last_error,
    updated_at = u.updated_at
FROM unnest(
    %(i_id)s::bigint[], %(i_status)s::text[], %(i_run_at)s::float8[],
    %(i_attempts)s::int[], %(i_lease_owner)s::text[], %(i_lease_token)s::text[],
    %(i_lease_expires_at)s::float8[], %(i_last_error)s::text[],
    %(i_updated_at)s::float8[]
) AS u (id, status, run_at, attempts, lease_owner, lease_token, lease_expires_at,
    last_error, updated_at)
WHERE j.id = u.id AND j.id = ANY (%(i_id)s::bigint[]);

-- name: insert_jobs
-- New jobs (an operator's retry).
INSERT INTO kirim_jobs (delivery_id, status, run_at, max_attempts, created_at, updated_at)
SELECT u.delivery_id, 'queued', u.run_at, u.max_attempts, %(now)s::float8, %(now)s::float8
FROM unnest(
    %(i_delivery_id)s::bigint[], %(i_run_at)s::float8[], %(i_max_attempts)s::int[]
) AS u (delivery_id, run_at, max_attempts);

-- name: insert_intents
-- Write-ahead attempt intents, each only while its claim token holds (the fence),
-- bounded in time (no request after send_deadline; none can land after settles_at),
-- with the channel each request goes to (provider: failover); requested_at NULL: the
-- database's clock (kirim_now), the statement being a transaction of its own.
-- FOR SHARE makes a concurrent claim wait for this commit, so that it sees the intent;
-- deliveries are locked in id order, as everywhere. The batch drives: each item's
-- delivery is looked up by its key (LATERAL), so no plan reads the batch again for each
-- delivery (a table never analyzed yet, or statistics that believe no delivery is
-- processing, once made the planner do that: a batch of n cost n squared).
INSERT INTO kirim_attempts
    (delivery_id, job_id, number, provider_request_id, worker_id, status, requested_at,
     send_deadline, settles_at, provider)
SELECT u.delivery_id, u.job_id, u.number, u.request_id, u.worker_id, 'requested',
       kirim_now(u.requested_at), u.send_deadline, u.settles_at, u.provider
FROM (
    SELECT * FROM unnest(
        %(i_delivery_id)s::bigint[], %(i_job_id)s::bigint[], %(i_token)s::text[],
        %(i_number)s::int[], %(i_request_id)s::text[], %(i_worker_id)s::text[],
        %(i_requested_at)s::float8[], %(i_send_deadline)s::float8[],
        %(i_settles_at)s::float8[], %(i_provider)s::text[]
    ) AS u (delivery_id, job_id, token, number, request_id, worker_id, requested_at,
        send_deadline, settles_at, provider)
    ORDER BY delivery_id
) u
CROSS JOIN LATERAL (
    SELECT d.id FROM kirim_deliveries d
    WHERE d.id = u.delivery_id AND d.claim_token = u.token AND d.status = 'processing'
    FOR SHARE
) d
RETURNING provider_request_id;

-- name: intents_written
-- Which of these requests have an attempt row (after insert_intents wrote fewer rows
-- than it was given: some claims were lost).
SELECT provider_request_id FROM kirim_attempts
WHERE provider_request_id = ANY (%(request_ids)s::text[]);

-- name: extend_leases
-- Heartbeat: extend job leases where the lease token holds.
UPDATE kirim_jobs j SET lease_expires_at = %(until)s::float8, updated_at = %(now)s::float8
FROM unnest(%(i_job_id)s::bigint[], %(i_delivery_id)s::bigint[], %(i_token)s::text[])
     AS u (job_id, delivery_id, token)
WHERE j.id = u.job_id AND j.lease_token = u.token AND j.status = 'running'
  AND j.id = ANY (%(i_job_id)s::bigint[])
RETURNING j.id, j.lease_token;

-- name: extend_claims
-- ... then delivery claims where the claim token holds.
UPDATE kirim_deliveries d SET claim_expires_at = %(until)s::float8
FROM unnest(%(i_job_id)s::bigint[], %(i_delivery_id)s::bigint[], %(i_token)s::text[])
     AS u (job_id, delivery_id, token)
WHERE d.id = u.delivery_id AND d.claim_token = u.token
  AND d.id = ANY (%(i_delivery_id)s::bigint[]);

-- name: notify
-- Wake the workers that listen (delivered at commit).
SELECT pg_notify('kirim_jobs', '');

-- name: finish_fenced
-- The plain finish of a batch (transitions.finish_fenced), one statement on its own
-- (autocommit: one round trip, no explicit row lock): each item's job, then its
-- delivery, then its attempt, each written only where the claim's token still holds on
-- both rows (the statement's own row locks: UPDATE waits for a concurrent writer and
-- checks the fence again on the row it left). Every job is updated before any delivery
-- (the ARRAY below is computed first), every delivery before any attempt: the lock
-- order of every transaction; the items come in job id order (docs/design.md, "Lock
-- order"). A job written whose delivery then failed its fence (its claim not the
-- job's lease: changed by a writer that did not wait for the job) aborts the whole
-- statement with an error naming kirim_fence_raced: nothing is written, and the batch
-- goes the careful way. Returns the finished items. The columns written are those of rules.committed_columns and
-- rules.job_committed_columns, the one rule of the commit.
WITH u AS (
    SELECT u.*, kirim_now(u.now) AS at, won.id AS won,
           -- the states the fences compare, carried by the batch's rows: a condition
           -- of the join, not a filter on the table, whose estimate then stays the
           -- batch's size (statistics that believe no job is running made a filter's
           -- estimate one row, and the plan read the batch again for each job)
           'running'::text AS leased, 'processing'::text AS claimed,
           '{requested,unknown}'::text[] AS open
    FROM unnest(
        %(i_delivery_id)s::bigint[], %(i_job_id)s::bigint[], %(i_token)s::text[],
        %(i_now)s::float8[], %(i_request_id)s::text[], %(i_outcome)s::text[],
        %(i_outcome_message_id)s::text[], %(i_outcome_error)s::text[],
        %(i_completed_at)s::float8[], %(i_status)s::text[], %(i_message_id)s::text[],
        %(i_error)s::text[], %(i_reason)s::text[], %(i_job_status)s::text[],
        %(i_run_at)s::float8[], %(i_delay)s::float8[]
    ) AS u (delivery_id, job_id, token, now, request_id, outcome, outcome_message_id,
        outcome_error, completed_at, status, message_id, error, reason, job_status,
        run_at, delay)
    -- a success of the delivery's, looked up by index per item (LIMIT 1: never a scan)
    LEFT JOIN LATERAL (
        SELECT s.id FROM kirim_attempts s
        WHERE s.delivery_id = u.delivery_id AND s.status = 'succeeded' AND u.status <> 'sent'
        LIMIT 1
    ) won ON true
),
j AS (
    UPDATE kirim_jobs j
    SET status = u.job_status, run_at = COALESCE(u.run_at, u.at + u.delay, j.run_at),
        last_error = u.error, lease_owner = NULL, lease_token = NULL,
        lease_expires_at = NULL, updated_at = u.at
    FROM u
    WHERE j.id = u.job_id AND j.delivery_id = u.delivery_id AND j.lease_token = u.token
      AND j.status = u.leased AND j.id = ANY (%(i_job_id)s::bigint[])
      -- a success recorded by any attempt outranks a failure: then the careful way
      AND (u.status = 'sent' OR u.won IS NULL)
    RETURNING j.id, j.delivery_id
),
d AS (
    UPDATE kirim_deliveries d
    SET status = u.status, doubt = NULL, claim_token = NULL, claimed_by = NULL,
        claim_expires_at = NULL,
        provider_message_id = COALESCE(u.message_id, d.provider_message_id),
        last_error = u.error,
        sent_at = CASE WHEN u.status = 'sent' THEN u.at ELSE d.sent_at END,
        reason = COALESCE(u.reason, d.reason), updated_at = u.at
    FROM u
    WHERE d.id = u.delivery_id AND d.claim_token = u.token AND d.status = u.claimed
      AND d.id = ANY (ARRAY(SELECT j.delivery_id FROM j))
    RETURNING d.id, d.provider_message_id
),
a AS (
    UPDATE kirim_attempts a
    SET status = u.outcome,
        provider_message_id = COALESCE(u.outcome_message_id, a.provider_message_id),
        error = u.outcome_error, completed_at = u.completed_at
    FROM u
    WHERE a.provider_request_id = u.request_id AND a.delivery_id = u.delivery_id
      AND a.status = ANY (u.open)
      AND a.provider_request_id = ANY (ARRAY(
          SELECT f.request_id FROM u f JOIN d ON d.id = f.delivery_id
          WHERE f.request_id IS NOT NULL))
    RETURNING a.delivery_id, a.provider_message_id
),
m AS (
    INSERT INTO kirim_message_ids (delivery_id, message_id)
    SELECT x.id, x.message_id
    FROM (SELECT d.id, d.provider_message_id AS message_id FROM d
          UNION SELECT a.delivery_id, a.provider_message_id FROM a) x
    WHERE x.message_id IS NOT NULL
    ORDER BY x.id, x.message_id
    ON CONFLICT DO NOTHING
)
SELECT j.id AS job_id, j.delivery_id,
       CASE WHEN n.jobs <> n.deliveries
            THEN CAST('kirim_fence_raced: ' || n.jobs - n.deliveries || ' of ' || n.jobs AS int)
       END AS raced
FROM j, (SELECT (SELECT count(*) FROM j) AS jobs, (SELECT count(*) FROM d) AS deliveries) n;
