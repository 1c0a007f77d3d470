-- Workflow runs and their steps (kirim.store.flows). Lock order: the run, then the
-- deliveries of its steps. The run's row is locked FOR UPDATE.

-- name: insert_run
-- A run, once per key (no row: the run exists already, or it was pruned and its
-- tombstone is kept: the event given again starts no second run).
INSERT INTO kirim_runs (key, type, event_id, recipient_id, status, cursor, next_at, steps,
                        data, messages, max_attempts, cancel_value, created_at, updated_at)
SELECT %(key)s, %(type)s, %(event_id)s, %(recipient_id)s, 'waiting', 0, %(now)s::float8,
       %(steps)s, %(data)s, %(messages)s, %(max_attempts)s::int, %(cancel_value)s,
       %(now)s::float8, %(now)s::float8
WHERE NOT EXISTS (SELECT 1 FROM kirim_run_tombstones WHERE key = %(key)s)
ON CONFLICT (key) DO NOTHING
RETURNING *;

-- name: run_by_key
-- A run by its key, or what its tombstone keeps of it once pruned (no steps, data nor
-- messages: kirim.store.retention_records).
SELECT * FROM kirim_runs WHERE key = %(key)s
UNION ALL
SELECT run_id AS id, key, type, event_id, recipient_id, status, cursor,
       NULL::float8 AS next_at, '[]' AS steps, '{}' AS data, '{}' AS messages,
       0 AS max_attempts, NULL AS cancel_value, why, NULL AS claim_token,
       NULL AS claimed_by, NULL::float8 AS claim_expires_at, created_at, updated_at
FROM kirim_run_tombstones
WHERE key = %(key)s AND NOT EXISTS (SELECT 1 FROM kirim_runs WHERE key = %(key)s);

-- name: run_by_id
-- A run by its id.
SELECT * FROM kirim_runs WHERE id = %(id)s::bigint;

-- name: lock_run
-- A run, its row locked.
SELECT * FROM kirim_runs WHERE id = %(id)s::bigint FOR UPDATE;

-- name: lock_runs
-- Runs, their rows locked in id order (every run of a transaction before any digest
-- window: kirim.store.run_digests).
SELECT id FROM kirim_runs WHERE id = ANY (%(ids)s::bigint[]) ORDER BY id FOR UPDATE;

-- name: claim_runs
-- Claim up to :limit due runs not claimed (or whose claim expired: a waiting run's next
-- step, a canceled run's deliveries not settled when it was canceled), each with a token
-- of its own (:token, then its id).
UPDATE kirim_runs
SET claim_token = %(token)s || ':' || id, claimed_by = %(worker)s,
    claim_expires_at = %(now)s::float8 + %(lease)s::float8, updated_at = %(now)s::float8
WHERE id IN (
    SELECT id FROM kirim_runs
    WHERE status IN ('waiting', 'canceled') AND next_at <= %(now)s::float8
      AND (claim_expires_at IS NULL OR claim_expires_at <= %(now)s::float8)
    ORDER BY next_at, id
    LIMIT %(limit)s::int
    FOR UPDATE SKIP LOCKED
)
RETURNING *;

-- name: run_steps
-- The recorded steps of a run, with what their deliveries are now.
SELECT s.*, d.status AS delivery_status, d.doubt AS delivery_doubt
FROM kirim_run_steps s LEFT JOIN kirim_deliveries d ON d.id = s.delivery_id
WHERE s.run_id = %(run_id)s::bigint
ORDER BY s.idx;

-- name: insert_run_step
-- What became of one step of a run (no row: it was recorded already).
INSERT INTO kirim_run_steps (run_id, idx, outcome, why, delivery_id, until_at, created_at)
VALUES (%(run_id)s::bigint, %(idx)s::int, %(outcome)s, %(why)s, %(delivery_id)s::bigint, %(until_at)s::float8, %(now)s::float8)
ON CONFLICT (run_id, idx) DO NOTHING
RETURNING run_id;

-- name: update_run
-- A run's status, next step and claim, written by the holder of its claim (or by a
-- cancel, which took the run's lock).
UPDATE kirim_runs
SET status = %(status)s::text, cursor = %(cursor)s::int, next_at = %(next_at)s::float8, why = %(why)s,
    claim_token = %(claim_token)s, claimed_by = %(claimed_by)s,
    claim_expires_at = %(claim_expires_at)s::float8, updated_at = %(now)s::float8
WHERE id = %(id)s::bigint;

-- name: step_delivery_state
-- What a branch reads of a step's delivery: its status and doubt, and its message in
-- the feed (the inbox), read and seen.
SELECT d.status, d.doubt, f.id AS feed_id, f.read_at, f.seen_at
FROM kirim_deliveries d LEFT JOIN kirim_feed f ON f.delivery_id = d.id
WHERE d.id = %(id)s::bigint;

-- name: runs_to_cancel
-- The runs of a type whose event had this cancellation value, not canceled already
-- (a done run's last deliveries may not have gone).
SELECT id FROM kirim_runs
WHERE type = %(type)s AND cancel_value = %(value)s AND status <> 'canceled'
ORDER BY id;

-- name: list_runs
-- The newest runs (of one status, or all).
SELECT * FROM kirim_runs
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
ORDER BY id DESC
LIMIT %(limit)s::int;

-- name: run_counts
-- Runs per status.
SELECT status, count(*) AS n FROM kirim_runs GROUP BY status;

-- name: drop_pruned_run_twin
-- The run just inserted, deleted again if a prune's tombstone holds its key: an insert
-- that waited on the key of a run being pruned finds it gone and inserts, though its
-- own snapshot saw no tombstone; this statement's snapshot, taken after, sees the
-- tombstone committed with the deletion (kirim.store.retention_records). SQLite, which
-- serialises writers, has no such twin and no such query.
DELETE FROM kirim_runs
WHERE id = %(id)s::bigint
  AND EXISTS (SELECT 1 FROM kirim_run_tombstones WHERE key = %(key)s)
RETURNING id;
