-- Retention (kirim.store.retention.prune), SQLite. Named parameters (:name); a set is
-- one JSON parameter (:ids a list of ids, :items a list of records, json_each).
--
-- These statements only find, count and delete rows: which delivery may go is decided
-- in Python (retention.prunable) on the rows read inside the transaction. Prune runs in
-- BEGIN IMMEDIATE like every write: the rows read cannot change before it commits (the
-- "lock_" queries only read, here).

-- name: prune_newest
-- The deliveries that hold the newest delivery, job and attempt ids: they stay, so that
-- SQLite (which gives a new row the largest id plus one) never hands out a pruned id.
SELECT (SELECT max(id) FROM kirim_deliveries) AS delivery,
       (SELECT delivery_id FROM kirim_jobs ORDER BY id DESC LIMIT 1) AS job,
       (SELECT delivery_id FROM kirim_attempts ORDER BY id DESC LIMIT 1) AS attempt;

-- name: prune_candidates
-- Up to :limit deliveries finished before :before (the oldest first), with no active
-- job and no attempt that may still land, nor one of the newest ids (:newest). INDEXED
-- BY: without statistics the planner would take kirim_deliveries_status, then read and
-- sort every finished delivery (seconds on a ledger of a million, under the write lock).
SELECT d.id FROM kirim_deliveries AS d INDEXED BY kirim_deliveries_finished
WHERE d.status IN ('sent', 'failed', 'canceled', 'delivered', 'bounced', 'suppressed') AND d.updated_at < :before
  AND d.id NOT IN (SELECT value FROM json_each(:newest))
  AND NOT EXISTS (SELECT 1 FROM kirim_jobs j
                  WHERE j.delivery_id = d.id AND j.status NOT IN ('completed', 'dead'))
  AND NOT EXISTS (SELECT 1 FROM kirim_attempts a
                  WHERE a.delivery_id = d.id AND a.status IN ('requested', 'unknown')
                    AND (a.settles_at IS NULL OR a.settles_at > :now))
ORDER BY d.updated_at, d.id
LIMIT :limit;

-- name: prune_count
-- A dry run: every delivery prune_candidates would find (without a limit), with the
-- jobs, attempts and HTTP request rows that would go with them.
SELECT COUNT(*) AS deliveries,
       SUM((SELECT COUNT(*) FROM kirim_jobs j WHERE j.delivery_id = d.id)) AS jobs,
       SUM((SELECT COUNT(*) FROM kirim_attempts a WHERE a.delivery_id = d.id)) AS attempts,
       SUM((SELECT COUNT(*) FROM kirim_requests r WHERE r.delivery_id = d.id)) AS requests
FROM kirim_deliveries AS d INDEXED BY kirim_deliveries_finished
WHERE d.status IN ('sent', 'failed', 'canceled', 'delivered', 'bounced', 'suppressed') AND d.updated_at < :before
  AND d.id NOT IN (SELECT value FROM json_each(:newest))
  AND NOT EXISTS (SELECT 1 FROM kirim_jobs j
                  WHERE j.delivery_id = d.id AND j.status NOT IN ('completed', 'dead'))
  AND NOT EXISTS (SELECT 1 FROM kirim_attempts a
                  WHERE a.delivery_id = d.id AND a.status IN ('requested', 'unknown')
                    AND (a.settles_at IS NULL OR a.settles_at > :now));

-- name: prune_count_tombstones
-- A dry run: the tombstones written before :before.
SELECT COUNT(*) AS n FROM kirim_key_tombstones WHERE pruned_at < :before;

-- name: prune_lock_jobs
-- The jobs of these deliveries.
SELECT * FROM kirim_jobs
WHERE delivery_id IN (SELECT value FROM json_each(:ids))
ORDER BY id;

-- name: prune_lock_deliveries
-- These deliveries.
SELECT * FROM kirim_deliveries WHERE id IN (SELECT value FROM json_each(:ids)) ORDER BY id;

-- name: prune_jobs_of
-- Every job of these deliveries.
SELECT * FROM kirim_jobs
WHERE delivery_id IN (SELECT value FROM json_each(:ids))
ORDER BY id;

-- name: prune_write_tombstones
-- One tombstone per pruned delivery (a key pruned again keeps the newest).
INSERT INTO kirim_key_tombstones (key_hash, delivery_id, status, seen_at, pruned_at)
SELECT u.value ->> 'key_hash', u.value ->> 'delivery_id', u.value ->> 'status',
       u.value ->> 'seen_at', u.value ->> 'pruned_at'
FROM json_each(:items) AS u
WHERE true
ON CONFLICT (key_hash) DO UPDATE
SET delivery_id = excluded.delivery_id, status = excluded.status,
    seen_at = excluded.seen_at, pruned_at = excluded.pruned_at;

-- name: prune_delete_attempts
-- The attempts of these deliveries.
DELETE FROM kirim_attempts WHERE delivery_id IN (SELECT value FROM json_each(:ids));

-- name: prune_delete_jobs
-- The jobs of these deliveries (after their attempts).
DELETE FROM kirim_jobs WHERE delivery_id IN (SELECT value FROM json_each(:ids));

-- name: prune_delete_requests
-- The HTTP service's request rows that name these deliveries.
DELETE FROM kirim_requests WHERE delivery_id IN (SELECT value FROM json_each(:ids));

-- name: prune_delete_deliveries
-- These deliveries (after their jobs and attempts).
DELETE FROM kirim_deliveries WHERE id IN (SELECT value FROM json_each(:ids));

-- name: prune_expire_tombstones
-- Up to :limit tombstones written before :before (the oldest first): their keys are free.
DELETE FROM kirim_key_tombstones
WHERE key_hash IN (SELECT key_hash FROM kirim_key_tombstones
                   WHERE pruned_at < :before ORDER BY pruned_at LIMIT :limit);
