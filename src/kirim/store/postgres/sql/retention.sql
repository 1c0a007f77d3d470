-- Retention (kirim.store.retention.prune), PostgreSQL (psycopg placeholders: %(name)s;
-- %(ids)s an array of ids; a step's items as one array per column, %(i_<column>)s).
--
-- These statements only find, lock, count and delete rows: which delivery may go is
-- decided in Python (retention.prunable) on the rows read under the locks. Lock order,
-- as everywhere: jobs before deliveries, each table in id order. Prune takes FOR UPDATE
-- (it deletes: no lock to upgrade later) and SKIP LOCKED: it never waits for a worker
-- nor makes one wait; what it skips goes in a later round.

-- name: prune_newest
-- The deliveries that hold the newest delivery, job and attempt ids: they stay (as on
-- SQLite, which would give a pruned id again; an identity never does, but the rule is
-- one for both).
SELECT (SELECT max(id) FROM kirim_deliveries) AS delivery,
       (SELECT delivery_id FROM kirim_jobs ORDER BY id DESC LIMIT 1) AS job,
       (SELECT delivery_id FROM kirim_attempts ORDER BY id DESC LIMIT 1) AS attempt;

-- name: prune_candidates
-- Up to %(limit)s deliveries finished before %(before)s (the oldest first), with no
-- active job, no attempt that may still land, nor one of the newest ids (%(newest)s);
-- no locks (judged again under them).
SELECT d.id FROM kirim_deliveries d
WHERE d.status IN ('sent', 'failed', 'canceled', 'delivered', 'bounced', 'suppressed') AND d.updated_at < %(before)s::float8
  AND d.id <> ALL (%(newest)s::bigint[])
  AND NOT EXISTS (SELECT 1 FROM kirim_jobs j
                  WHERE j.delivery_id = d.id AND j.status NOT IN ('completed', 'dead'))
  AND NOT EXISTS (SELECT 1 FROM kirim_attempts a
                  WHERE a.delivery_id = d.id AND a.status IN ('requested', 'unknown')
                    AND (a.settles_at IS NULL OR a.settles_at > %(now)s::float8))
ORDER BY d.updated_at, d.id
LIMIT %(limit)s;

-- name: prune_count
-- A dry run: every delivery prune_candidates would find (without a limit), with the
-- jobs, attempts and HTTP request rows that would go with them.
SELECT count(*) AS deliveries,
       sum((SELECT count(*) FROM kirim_jobs j WHERE j.delivery_id = d.id)) AS jobs,
       sum((SELECT count(*) FROM kirim_attempts a WHERE a.delivery_id = d.id)) AS attempts,
       sum((SELECT count(*) FROM kirim_requests r WHERE r.delivery_id = d.id)) AS requests
FROM kirim_deliveries d
WHERE d.status IN ('sent', 'failed', 'canceled', 'delivered', 'bounced', 'suppressed') AND d.updated_at < %(before)s::float8
  AND d.id <> ALL (%(newest)s::bigint[])
  AND NOT EXISTS (SELECT 1 FROM kirim_jobs j
                  WHERE j.delivery_id = d.id AND j.status NOT IN ('completed', 'dead'))
  AND NOT EXISTS (SELECT 1 FROM kirim_attempts a
                  WHERE a.delivery_id = d.id AND a.status IN ('requested', 'unknown')
                    AND (a.settles_at IS NULL OR a.settles_at > %(now)s::float8));

-- name: prune_count_tombstones
-- A dry run: the tombstones written before %(before)s.
SELECT count(*) AS n FROM kirim_key_tombstones WHERE pruned_at < %(before)s::float8;

-- name: prune_lock_jobs
-- Lock the jobs of these deliveries (skipping those another transaction holds).
SELECT * FROM kirim_jobs
WHERE delivery_id = ANY (%(ids)s::bigint[])
ORDER BY id
FOR UPDATE SKIP LOCKED;

-- name: prune_lock_deliveries
-- ... then these deliveries (skipping those another transaction holds).
SELECT * FROM kirim_deliveries WHERE id = ANY (%(ids)s::bigint[])
ORDER BY id
FOR UPDATE SKIP LOCKED;

-- name: prune_jobs_of
-- After the locks (a new snapshot): every job of these deliveries.
SELECT * FROM kirim_jobs WHERE delivery_id = ANY (%(ids)s::bigint[]) ORDER BY id;

-- name: prune_write_tombstones
-- One tombstone per pruned delivery (a key pruned again keeps the newest).
INSERT INTO kirim_key_tombstones (key_hash, delivery_id, status, seen_at, pruned_at)
SELECT u.key_hash, u.delivery_id, u.status, u.seen_at, u.pruned_at
FROM unnest(
    %(i_key_hash)s::text[], %(i_delivery_id)s::bigint[], %(i_status)s::text[],
    %(i_seen_at)s::float8[], %(i_pruned_at)s::float8[]
) AS u (key_hash, delivery_id, status, seen_at, pruned_at)
ON CONFLICT (key_hash) DO UPDATE
SET delivery_id = excluded.delivery_id, status = excluded.status,
    seen_at = excluded.seen_at, pruned_at = excluded.pruned_at;

-- name: prune_delete_attempts
-- The attempts of these deliveries.
DELETE FROM kirim_attempts WHERE delivery_id = ANY (%(ids)s::bigint[]);

-- name: prune_delete_jobs
-- The jobs of these deliveries (after their attempts).
DELETE FROM kirim_jobs WHERE delivery_id = ANY (%(ids)s::bigint[]);

-- name: prune_delete_requests
-- The HTTP service's request rows that name these deliveries.
DELETE FROM kirim_requests WHERE delivery_id = ANY (%(ids)s::bigint[]);

-- name: prune_delete_deliveries
-- These deliveries (after their jobs and attempts).
DELETE FROM kirim_deliveries WHERE id = ANY (%(ids)s::bigint[]);

-- name: prune_expire_tombstones
-- Up to %(limit)s tombstones written before %(before)s (the oldest first; skipping
-- those locked): their keys are free again.
DELETE FROM kirim_key_tombstones
WHERE key_hash IN (SELECT key_hash FROM kirim_key_tombstones
                   WHERE pruned_at < %(before)s::float8
                   ORDER BY pruned_at
                   LIMIT %(limit)s
                   FOR UPDATE SKIP LOCKED);
