-- Retention (kirim.store.retention.prune), PostgreSQL (psycopg placeholders: %(name)s;
-- %(ids)s an array of ids; a step's items as one array per column, %(i_<column>)s).
--
-- These statements only find, lock, count and delete rows: which delivery may go is
-- decided in Python (retention.prunable) on the rows read under the locks. Lock order:
-- jobs before deliveries, as everywhere, and a delivery's digest before it, as the seal
-- and the enqueue take them; each table in id (key) order. Prune takes FOR UPDATE (it
-- deletes: no lock to upgrade later) and SKIP LOCKED: it never waits for a worker nor
-- makes one wait; what it skips goes in a later round. The notification tables' rows
-- that prune empties or deletes are taken likewise (SKIP LOCKED).

-- name: prune_newest
-- The deliveries that hold the newest delivery, job and attempt ids: they stay (as on
-- SQLite, which would give a pruned id again; an identity never does, but the rule is
-- one for both).
SELECT (SELECT max(id) FROM kirim_deliveries) AS delivery,
       (SELECT delivery_id FROM kirim_jobs ORDER BY id DESC LIMIT 1) AS job,
       (SELECT delivery_id FROM kirim_attempts ORDER BY id DESC LIMIT 1) AS attempt;

-- name: prune_candidates
-- Up to %(limit)s deliveries finished before %(before)s (the lowest ids first: the
-- primary key's order; no index names status or updated_at, which every transition
-- changes: migration 0012), with no
-- active job, no attempt that may still land, nor one of the newest ids (%(newest)s),
-- nor a digest whose window is not closed (it ended at or after %(closed)s); no locks
-- (judged again under them).
-- Never a delivery of a step of a run not over (waiting, or canceled and coming back:
-- a branch reads it, a cancel comes back to it; kirim.store.retention_records).
SELECT d.id, d.idempotency_key FROM kirim_deliveries d
WHERE d.status IN ('sent', 'failed', 'canceled', 'delivered', 'bounced', 'suppressed') AND d.updated_at < %(before)s::float8
  AND d.id <> ALL (%(newest)s::bigint[])
  AND NOT EXISTS (SELECT 1 FROM kirim_jobs j
                  WHERE j.delivery_id = d.id AND j.status NOT IN ('completed', 'dead'))
  AND NOT EXISTS (SELECT 1 FROM kirim_attempts a
                  WHERE a.delivery_id = d.id AND a.status IN ('requested', 'unknown')
                    AND (a.settles_at IS NULL OR a.settles_at > %(now)s::float8))
  AND NOT EXISTS (SELECT 1 FROM kirim_digests g
                  WHERE g.key = d.idempotency_key AND g.window_end >= %(closed)s::float8)
  AND NOT EXISTS (SELECT 1 FROM kirim_run_steps s JOIN kirim_runs r ON r.id = s.run_id
                  WHERE s.delivery_id = d.id
                    AND (r.status = 'waiting' OR r.next_at IS NOT NULL))
ORDER BY d.id
LIMIT %(limit)s;

-- name: prune_count
-- A dry run: every delivery prune_candidates would find (without a limit), with the
-- jobs, attempts and HTTP request rows that would go with them, and their digests with
-- those digests' events.
SELECT count(*) AS deliveries,
       sum((SELECT count(*) FROM kirim_jobs j WHERE j.delivery_id = d.id)) AS jobs,
       sum((SELECT count(*) FROM kirim_attempts a WHERE a.delivery_id = d.id)) AS attempts,
       sum((SELECT count(*) FROM kirim_requests r WHERE r.delivery_id = d.id)) AS requests,
       sum((SELECT count(*) FROM kirim_digests g WHERE g.key = d.idempotency_key)) AS digests,
       sum((SELECT count(*) FROM kirim_digest_events e
            WHERE e.digest_key = d.idempotency_key AND e.pruned_at IS NULL)) AS digest_events
FROM kirim_deliveries d
WHERE d.status IN ('sent', 'failed', 'canceled', 'delivered', 'bounced', 'suppressed') AND d.updated_at < %(before)s::float8
  AND d.id <> ALL (%(newest)s::bigint[])
  AND NOT EXISTS (SELECT 1 FROM kirim_jobs j
                  WHERE j.delivery_id = d.id AND j.status NOT IN ('completed', 'dead'))
  AND NOT EXISTS (SELECT 1 FROM kirim_attempts a
                  WHERE a.delivery_id = d.id AND a.status IN ('requested', 'unknown')
                    AND (a.settles_at IS NULL OR a.settles_at > %(now)s::float8))
  AND NOT EXISTS (SELECT 1 FROM kirim_digests g
                  WHERE g.key = d.idempotency_key AND g.window_end >= %(closed)s::float8)
  AND NOT EXISTS (SELECT 1 FROM kirim_run_steps s JOIN kirim_runs r ON r.id = s.run_id
                  WHERE s.delivery_id = d.id
                    AND (r.status = 'waiting' OR r.next_at IS NOT NULL));

-- name: prune_count_tombstones
-- A dry run: the tombstones written before %(before)s.
SELECT count(*) AS n FROM kirim_key_tombstones WHERE pruned_at < %(before)s::float8;

-- name: prune_count_layer
-- A dry run: the digests pruned already (with their events whose data is still kept),
-- the events of pruned digests marked before %(before)s, the throttle counters of
-- windows that ended before %(closed)s.
SELECT (SELECT count(*) FROM kirim_digests WHERE pruned_at IS NOT NULL) AS digests,
       (SELECT count(*) FROM kirim_digests g JOIN kirim_digest_events e ON e.digest_key = g.key
        WHERE g.pruned_at IS NOT NULL AND e.pruned_at IS NULL) AS digest_events,
       (SELECT count(*) FROM kirim_digest_events WHERE pruned_at < %(before)s::float8)
           AS digest_events_expired,
       (SELECT count(*) FROM kirim_throttle WHERE window_end < %(closed)s::float8)
           AS throttle_expired;

-- name: prune_lock_jobs
-- Lock the jobs of these deliveries (skipping those another transaction holds).
SELECT * FROM kirim_jobs
WHERE delivery_id = ANY (%(ids)s::bigint[])
ORDER BY id
FOR UPDATE SKIP LOCKED;

-- name: prune_lock_digests
-- ... then the digests of these deliveries (by their idempotency keys, %(keys)s;
-- skipping those another transaction holds: an enqueue adding an event, a seal).
SELECT * FROM kirim_digests WHERE key = ANY (%(keys)s::text[])
ORDER BY key
FOR UPDATE SKIP LOCKED;

-- name: prune_lock_deliveries
-- ... then these deliveries (skipping those another transaction holds).
SELECT * FROM kirim_deliveries WHERE id = ANY (%(ids)s::bigint[])
ORDER BY id
FOR UPDATE SKIP LOCKED;

-- name: prune_jobs_of
-- After the locks (a new snapshot): every job of these deliveries.
SELECT * FROM kirim_jobs WHERE delivery_id = ANY (%(ids)s::bigint[]) ORDER BY id;

-- name: prune_digests_of
-- After the locks: every digest of these deliveries (by their idempotency keys).
SELECT * FROM kirim_digests WHERE key = ANY (%(keys)s::text[]) ORDER BY key;

-- name: prune_write_tombstones
-- One tombstone per pruned delivery (a key pruned again keeps the newest).
INSERT INTO kirim_key_tombstones (key_hash, delivery_id, status, doubt, seen_at, pruned_at)
SELECT u.key_hash, u.delivery_id, u.status, u.doubt, u.seen_at, u.pruned_at
FROM unnest(
    %(i_key_hash)s::text[], %(i_delivery_id)s::bigint[], %(i_status)s::text[],
    %(i_doubt)s::text[], %(i_seen_at)s::float8[], %(i_pruned_at)s::float8[]
) AS u (key_hash, delivery_id, status, doubt, seen_at, pruned_at)
ON CONFLICT (key_hash) DO UPDATE
SET delivery_id = excluded.delivery_id, status = excluded.status, doubt = excluded.doubt,
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

-- name: prune_mark_digests
-- The digests of the deliveries just pruned (locked above): pruned at %(now)s, the time
-- of their tombstones.
UPDATE kirim_digests SET pruned_at = %(now)s::float8
WHERE key = ANY (%(keys)s::text[]) AND pruned_at IS NULL;

-- name: prune_empty_digest_events
-- Up to %(limit)s events of pruned digests, their data emptied (skipping those locked):
-- the row stays (stream, event id, digest key) with its digest's pruned_at, so the
-- event is still held.
UPDATE kirim_digest_events e
SET data = 'null', pruned_at = g.pruned_at
FROM kirim_digests g
WHERE g.key = e.digest_key
  AND e.id IN (SELECT pe.id FROM kirim_digests pd
               JOIN kirim_digest_events pe ON pe.digest_key = pd.key
               WHERE pd.pruned_at IS NOT NULL AND pe.pruned_at IS NULL
               LIMIT %(limit)s
               FOR UPDATE OF pe SKIP LOCKED);

-- name: prune_delete_digests
-- Up to %(limit)s pruned digests none of whose events still holds data (skipping those
-- locked).
DELETE FROM kirim_digests
WHERE key IN (SELECT g.key FROM kirim_digests g
              WHERE g.pruned_at IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM kirim_digest_events e
                                WHERE e.digest_key = g.key AND e.pruned_at IS NULL)
              ORDER BY g.pruned_at
              LIMIT %(limit)s
              FOR UPDATE SKIP LOCKED);

-- name: prune_expire_digest_events
-- Up to %(limit)s events of digests pruned before %(before)s (the oldest first; skipping
-- those locked): the same cutoff as their tombstones', after which they are free again.
DELETE FROM kirim_digest_events
WHERE id IN (SELECT id FROM kirim_digest_events
             WHERE pruned_at < %(before)s::float8
             ORDER BY pruned_at
             LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED);

-- name: prune_expire_throttle
-- Up to %(limit)s throttle counters of windows that ended before %(closed)s (the oldest
-- first; skipping those locked): nothing counts into them any more.
DELETE FROM kirim_throttle
WHERE (scope, window_start) IN (SELECT scope, window_start FROM kirim_throttle
                                WHERE window_end < %(closed)s::float8
                                ORDER BY window_end
                                LIMIT %(limit)s
                                FOR UPDATE SKIP LOCKED);

-- name: prune_expire_tombstones
-- Up to %(limit)s tombstones written before %(before)s (the oldest first; skipping
-- those locked): their keys are free again.
DELETE FROM kirim_key_tombstones
WHERE key_hash IN (SELECT key_hash FROM kirim_key_tombstones
                   WHERE pruned_at < %(before)s::float8
                   ORDER BY pruned_at
                   LIMIT %(limit)s
                   FOR UPDATE SKIP LOCKED);

-- name: prune_feed
-- Up to %(limit)s feed messages (the in-app inbox) that came before %(before)s, or were
-- archived or deleted before %(archived_before)s, oldest first (skipping those locked);
-- never one whose delivery has an attempt that may still land (its late commit would
-- write it again).
DELETE FROM kirim_feed
WHERE id IN (SELECT f.id FROM kirim_feed f
             WHERE (f.created_at < %(before)s::float8
                    OR coalesce(f.archived_at, f.deleted_at) < %(archived_before)s::float8)
               AND NOT EXISTS (
                   SELECT 1 FROM kirim_attempts a
                   WHERE a.delivery_id = f.delivery_id AND a.status IN ('requested', 'unknown')
                     AND (a.settles_at IS NULL OR a.settles_at > %(now)s::float8))
             ORDER BY f.id LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED);

-- name: prune_count_feed
-- A dry run: the feed messages prune_feed would delete.
SELECT COUNT(*) AS n FROM kirim_feed f
WHERE (f.created_at < %(before)s::float8
       OR coalesce(f.archived_at, f.deleted_at) < %(archived_before)s::float8)
  AND NOT EXISTS (
      SELECT 1 FROM kirim_attempts a
      WHERE a.delivery_id = f.delivery_id AND a.status IN ('requested', 'unknown')
        AND (a.settles_at IS NULL OR a.settles_at > %(now)s::float8));
