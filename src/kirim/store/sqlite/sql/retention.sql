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
-- Up to :limit deliveries finished before :before (the lowest ids first: the rowid's
-- order; no index names status or updated_at, which every transition changes:
-- migration 0012), with no active job and no attempt that may still land, nor one of
-- the newest ids (:newest), nor a digest whose window is not closed (it ended at or
-- after :closed).
-- Never a delivery of a step of a run not over (waiting, or canceled and coming back:
-- a branch reads it, a cancel comes back to it; kirim.store.retention_records).
SELECT d.id, d.idempotency_key FROM kirim_deliveries AS d
WHERE d.status IN ('sent', 'failed', 'canceled', 'delivered', 'bounced', 'suppressed') AND d.updated_at < :before
  AND d.id NOT IN (SELECT value FROM json_each(:newest))
  AND NOT EXISTS (SELECT 1 FROM kirim_jobs j
                  WHERE j.delivery_id = d.id AND j.status NOT IN ('completed', 'dead'))
  AND NOT EXISTS (SELECT 1 FROM kirim_attempts a
                  WHERE a.delivery_id = d.id AND a.status IN ('requested', 'unknown')
                    AND (a.settles_at IS NULL OR a.settles_at > :now))
  AND NOT EXISTS (SELECT 1 FROM kirim_digests g
                  WHERE g.key = d.idempotency_key AND g.window_end >= :closed)
  AND NOT EXISTS (SELECT 1 FROM kirim_run_steps s JOIN kirim_runs r ON r.id = s.run_id
                  WHERE s.delivery_id = d.id
                    AND (r.status = 'waiting' OR r.next_at IS NOT NULL))
ORDER BY d.id
LIMIT :limit;

-- name: prune_count
-- A dry run: every delivery prune_candidates would find (without a limit), with the
-- jobs, attempts and HTTP request rows that would go with them, and their digests with
-- those digests' events.
SELECT COUNT(*) AS deliveries,
       SUM((SELECT COUNT(*) FROM kirim_jobs j WHERE j.delivery_id = d.id)) AS jobs,
       SUM((SELECT COUNT(*) FROM kirim_attempts a WHERE a.delivery_id = d.id)) AS attempts,
       SUM((SELECT COUNT(*) FROM kirim_requests r WHERE r.delivery_id = d.id)) AS requests,
       SUM((SELECT COUNT(*) FROM kirim_digests g WHERE g.key = d.idempotency_key)) AS digests,
       SUM((SELECT COUNT(*) FROM kirim_digest_events e
            WHERE e.digest_key = d.idempotency_key AND e.pruned_at IS NULL)) AS digest_events
FROM kirim_deliveries AS d
WHERE d.status IN ('sent', 'failed', 'canceled', 'delivered', 'bounced', 'suppressed') AND d.updated_at < :before
  AND d.id NOT IN (SELECT value FROM json_each(:newest))
  AND NOT EXISTS (SELECT 1 FROM kirim_jobs j
                  WHERE j.delivery_id = d.id AND j.status NOT IN ('completed', 'dead'))
  AND NOT EXISTS (SELECT 1 FROM kirim_attempts a
                  WHERE a.delivery_id = d.id AND a.status IN ('requested', 'unknown')
                    AND (a.settles_at IS NULL OR a.settles_at > :now))
  AND NOT EXISTS (SELECT 1 FROM kirim_digests g
                  WHERE g.key = d.idempotency_key AND g.window_end >= :closed)
  AND NOT EXISTS (SELECT 1 FROM kirim_run_steps s JOIN kirim_runs r ON r.id = s.run_id
                  WHERE s.delivery_id = d.id
                    AND (r.status = 'waiting' OR r.next_at IS NOT NULL));

-- name: prune_count_tombstones
-- A dry run: the tombstones written before :before.
SELECT COUNT(*) AS n FROM kirim_key_tombstones WHERE pruned_at < :before;

-- name: prune_count_layer
-- A dry run: the digests pruned already (with their events whose data is still kept),
-- the events of pruned digests marked before :before, the throttle counters of windows
-- that ended before :closed.
SELECT (SELECT COUNT(*) FROM kirim_digests WHERE pruned_at IS NOT NULL) AS digests,
       (SELECT COUNT(*) FROM kirim_digests g JOIN kirim_digest_events e ON e.digest_key = g.key
        WHERE g.pruned_at IS NOT NULL AND e.pruned_at IS NULL) AS digest_events,
       (SELECT COUNT(*) FROM kirim_digest_events WHERE pruned_at < :before)
           AS digest_events_expired,
       (SELECT COUNT(*) FROM kirim_throttle WHERE window_end < :closed) AS throttle_expired;

-- name: prune_lock_jobs
-- The jobs of these deliveries.
SELECT * FROM kirim_jobs
WHERE delivery_id IN (SELECT value FROM json_each(:ids))
ORDER BY id;

-- name: prune_lock_digests
-- The digests of these deliveries (by their idempotency keys, :keys).
SELECT * FROM kirim_digests WHERE key IN (SELECT value FROM json_each(:keys)) ORDER BY key;

-- name: prune_lock_deliveries
-- These deliveries.
SELECT * FROM kirim_deliveries WHERE id IN (SELECT value FROM json_each(:ids)) ORDER BY id;

-- name: prune_jobs_of
-- Every job of these deliveries.
SELECT * FROM kirim_jobs
WHERE delivery_id IN (SELECT value FROM json_each(:ids))
ORDER BY id;

-- name: prune_digests_of
-- Every digest of these deliveries (by their idempotency keys, :keys).
SELECT * FROM kirim_digests WHERE key IN (SELECT value FROM json_each(:keys)) ORDER BY key;

-- name: prune_write_tombstones
-- One tombstone per pruned delivery (a key pruned again keeps the newest).
INSERT INTO kirim_key_tombstones (key_hash, delivery_id, status, doubt, seen_at, pruned_at)
SELECT u.value ->> 'key_hash', u.value ->> 'delivery_id', u.value ->> 'status',
       u.value ->> 'doubt', u.value ->> 'seen_at', u.value ->> 'pruned_at'
FROM json_each(:items) AS u
WHERE true
ON CONFLICT (key_hash) DO UPDATE
SET delivery_id = excluded.delivery_id, status = excluded.status, doubt = excluded.doubt,
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

-- name: prune_mark_digests
-- The digests of the deliveries just pruned (by their keys, :keys): pruned at :now,
-- the time of their tombstones.
UPDATE kirim_digests SET pruned_at = :now
WHERE key IN (SELECT value FROM json_each(:keys)) AND pruned_at IS NULL;

-- name: prune_empty_digest_events
-- Up to :limit events of pruned digests, their data emptied: the row stays (stream,
-- event id, digest key) with its digest's pruned_at, so the event is still held.
UPDATE kirim_digest_events
SET data = 'null',
    pruned_at = (SELECT g.pruned_at FROM kirim_digests g
                 WHERE g.key = kirim_digest_events.digest_key)
WHERE id IN (SELECT e.id FROM kirim_digests g
             JOIN kirim_digest_events e ON e.digest_key = g.key
             WHERE g.pruned_at IS NOT NULL AND e.pruned_at IS NULL
             LIMIT :limit);

-- name: prune_delete_digests
-- Up to :limit pruned digests none of whose events still holds data.
DELETE FROM kirim_digests
WHERE key IN (SELECT g.key FROM kirim_digests g
              WHERE g.pruned_at IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM kirim_digest_events e
                                WHERE e.digest_key = g.key AND e.pruned_at IS NULL)
              ORDER BY g.pruned_at
              LIMIT :limit);

-- name: prune_expire_digest_events
-- Up to :limit events of digests pruned before :before (the oldest first): the same
-- cutoff as their tombstones', after which the events are free again.
DELETE FROM kirim_digest_events
WHERE id IN (SELECT id FROM kirim_digest_events
             WHERE pruned_at < :before ORDER BY pruned_at LIMIT :limit);

-- name: prune_expire_throttle
-- Up to :limit throttle counters of windows that ended before :closed (the oldest
-- first): nothing counts into them any more.
DELETE FROM kirim_throttle
WHERE rowid IN (SELECT rowid FROM kirim_throttle
                WHERE window_end < :closed ORDER BY window_end LIMIT :limit);

-- name: prune_expire_tombstones
-- Up to :limit tombstones written before :before (the oldest first): their keys are free.
DELETE FROM kirim_key_tombstones
WHERE key_hash IN (SELECT key_hash FROM kirim_key_tombstones
                   WHERE pruned_at < :before ORDER BY pruned_at LIMIT :limit);

-- name: prune_feed
-- Up to :limit feed messages (the in-app inbox) that came before :before, or were
-- archived or deleted before :archived_before, oldest first; never one whose delivery
-- has an attempt that may still land (its late commit would write it again).
DELETE FROM kirim_feed
WHERE id IN (SELECT f.id FROM kirim_feed f
             WHERE (f.created_at < :before
                    OR coalesce(f.archived_at, f.deleted_at) < :archived_before)
               AND NOT EXISTS (
                   SELECT 1 FROM kirim_attempts a
                   WHERE a.delivery_id = f.delivery_id AND a.status IN ('requested', 'unknown')
                     AND (a.settles_at IS NULL OR a.settles_at > :now))
             ORDER BY f.id LIMIT :limit);

-- name: prune_count_feed
-- A dry run: the feed messages prune_feed would delete.
SELECT COUNT(*) AS n FROM kirim_feed f
WHERE (f.created_at < :before
       OR coalesce(f.archived_at, f.deleted_at) < :archived_before)
  AND NOT EXISTS (
      SELECT 1 FROM kirim_attempts a
      WHERE a.delivery_id = f.delivery_id AND a.status IN ('requested', 'unknown')
        AND (a.settles_at IS NULL OR a.settles_at > :now));
