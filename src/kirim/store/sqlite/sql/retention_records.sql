-- Retention of workflow runs, topic events and ended subscriptions
-- (kirim.store.retention_records), SQLite. Named parameters (:name); a set is one JSON
-- parameter (:ids a list of ids, :items a list of records, json_each). Prune runs in
-- BEGIN IMMEDIATE like every write: the rows read cannot change before it commits (the
-- "lock_" queries only read, here).

-- name: prune_run_candidates
-- Up to :limit runs over (done, or canceled with nothing to come back for: next_at is
-- NULL) last changed before :before, oldest first, none of whose steps' deliveries is
-- kept (the delivery prune takes a run's deliveries only once the run is over).
SELECT r.id FROM kirim_runs r
WHERE r.next_at IS NULL AND r.status IN ('done', 'canceled') AND r.updated_at < :before
  AND NOT EXISTS (SELECT 1 FROM kirim_run_steps s JOIN kirim_deliveries d ON d.id = s.delivery_id
                  WHERE s.run_id = r.id)
ORDER BY r.updated_at, r.id
LIMIT :limit;

-- name: prune_lock_runs
-- These runs.
SELECT * FROM kirim_runs WHERE id IN (SELECT value FROM json_each(:ids)) ORDER BY id;

-- name: prune_runs_holding
-- After the locks: those of these runs one of whose steps' deliveries is still kept.
SELECT DISTINCT s.run_id FROM kirim_run_steps s JOIN kirim_deliveries d ON d.id = s.delivery_id
WHERE s.run_id IN (SELECT value FROM json_each(:ids));

-- name: prune_write_run_tombstones
-- One tombstone per pruned run (its key; a key pruned again keeps the newest).
INSERT INTO kirim_run_tombstones (key, run_id, type, event_id, recipient_id, status, cursor,
                                  why, created_at, updated_at, pruned_at)
SELECT u.value ->> 'key', u.value ->> 'run_id', u.value ->> 'type', u.value ->> 'event_id',
       u.value ->> 'recipient_id', u.value ->> 'status', u.value ->> 'cursor',
       u.value ->> 'why', u.value ->> 'created_at', u.value ->> 'updated_at',
       u.value ->> 'pruned_at'
FROM json_each(:items) AS u
WHERE true
ON CONFLICT (key) DO UPDATE
SET run_id = excluded.run_id, status = excluded.status, cursor = excluded.cursor,
    why = excluded.why, created_at = excluded.created_at, updated_at = excluded.updated_at,
    pruned_at = excluded.pruned_at;

-- name: prune_delete_run_steps
-- The steps of these runs.
DELETE FROM kirim_run_steps WHERE run_id IN (SELECT value FROM json_each(:ids));

-- name: prune_delete_runs
-- These runs (after their steps).
DELETE FROM kirim_runs WHERE id IN (SELECT value FROM json_each(:ids));

-- name: prune_topic_event_candidates
-- Up to :limit topic events fully fanned out (done) before :before, oldest first; never
-- the newest (SQLite would give its id again).
SELECT e.id FROM kirim_topic_events e
WHERE e.status = 'done' AND e.finished_at < :before
  AND e.id < (SELECT max(id) FROM kirim_topic_events)
ORDER BY e.finished_at, e.id
LIMIT :limit;

-- name: prune_lock_topic_events
-- These topic events.
SELECT * FROM kirim_topic_events WHERE id IN (SELECT value FROM json_each(:ids)) ORDER BY id;

-- name: prune_write_topic_event_tombstones
-- One tombstone per pruned topic event (its type, event id and topic).
INSERT INTO kirim_topic_event_tombstones (type, event_id, topic, id, mark, batches, recipients,
                                          created_at, finished_at, pruned_at)
SELECT u.value ->> 'type', u.value ->> 'event_id', u.value ->> 'topic', u.value ->> 'id',
       u.value ->> 'mark', u.value ->> 'batches', u.value ->> 'recipients',
       u.value ->> 'created_at', u.value ->> 'finished_at', u.value ->> 'pruned_at'
FROM json_each(:items) AS u
WHERE true
ON CONFLICT (type, event_id, topic) DO UPDATE
SET id = excluded.id, mark = excluded.mark, batches = excluded.batches,
    recipients = excluded.recipients, created_at = excluded.created_at,
    finished_at = excluded.finished_at, pruned_at = excluded.pruned_at;

-- name: prune_delete_topic_events
-- These topic events.
DELETE FROM kirim_topic_events WHERE id IN (SELECT value FROM json_each(:ids));

-- name: prune_subscriptions
-- Up to :limit subscriptions ended (unsubscribed) before :before, oldest first, that no
-- fan-out still running reads (an event expanding whose mark is before their end).
DELETE FROM kirim_topic_subscriptions
WHERE id IN (SELECT s.id FROM kirim_topic_subscriptions s
             WHERE s.removed_seq IS NOT NULL AND s.removed_at < :before
               AND NOT EXISTS (SELECT 1 FROM kirim_topic_events e
                               WHERE e.topic = s.topic AND e.status = 'expanding'
                                 AND e.mark < s.removed_seq)
             ORDER BY s.removed_at LIMIT :limit);

-- name: prune_expire_run_tombstones
-- Up to :limit run tombstones written before :before (the oldest first): their events
-- start runs again.
DELETE FROM kirim_run_tombstones
WHERE key IN (SELECT key FROM kirim_run_tombstones
              WHERE pruned_at < :before ORDER BY pruned_at LIMIT :limit);

-- name: prune_expire_topic_event_tombstones
-- Up to :limit topic event tombstones written before :before (the oldest first).
DELETE FROM kirim_topic_event_tombstones
WHERE rowid IN (SELECT rowid FROM kirim_topic_event_tombstones
                WHERE pruned_at < :before ORDER BY pruned_at LIMIT :limit);

-- name: prune_count_records
-- What a round would delete now, at most: the runs whose deliveries are at rest and
-- older than the cut-off (one of those deliveries may stay, and its run with it; the
-- runs that go are ``gone``) with their steps, the digest windows sealed or ended
-- whose members all go, the topic events and subscriptions, and the tombstones of
-- runs and topic events written before :forgotten.
WITH gone AS (
  SELECT r.id FROM kirim_runs r
  WHERE r.next_at IS NULL AND r.status IN ('done', 'canceled')
    AND r.updated_at < :before
    AND NOT EXISTS (SELECT 1 FROM kirim_run_steps s
                    JOIN kirim_deliveries d ON d.id = s.delivery_id
                    WHERE s.run_id = r.id
                      AND (d.status NOT IN ('sent', 'failed', 'canceled', 'delivered',
                                            'bounced', 'suppressed')
                           OR d.updated_at >= :before)))
SELECT
  (SELECT COUNT(*) FROM gone) AS runs,
  (SELECT COUNT(*) FROM kirim_run_steps x WHERE x.run_id IN (SELECT id FROM gone))
      AS run_steps,
  (SELECT COUNT(*) FROM kirim_run_digests w
   WHERE (w.sealed_at IS NOT NULL OR w.window_end < :before)
     AND NOT EXISTS (SELECT 1 FROM kirim_run_digest_members m
                     WHERE m.stream = w.stream AND m.window_start = w.window_start
                       AND m.run_id NOT IN (SELECT id FROM gone))) AS run_digests,
  (SELECT COUNT(*) FROM kirim_topic_events e
   WHERE e.status = 'done' AND e.finished_at < :before
     AND e.id < (SELECT max(id) FROM kirim_topic_events)) AS topic_events,
  (SELECT COUNT(*) FROM kirim_topic_subscriptions s
   WHERE s.removed_seq IS NOT NULL AND s.removed_at < :before
     AND NOT EXISTS (SELECT 1 FROM kirim_topic_events e
                     WHERE e.topic = s.topic AND e.status = 'expanding'
                       AND e.mark < s.removed_seq)) AS subscriptions,
  (SELECT COUNT(*) FROM kirim_run_tombstones WHERE pruned_at < :forgotten)
  + (SELECT COUNT(*) FROM kirim_topic_event_tombstones WHERE pruned_at < :forgotten)
      AS tombstones_expired;

-- name: prune_delete_run_digest_members
-- The digest windows' memberships of these runs.
DELETE FROM kirim_run_digest_members WHERE run_id IN (SELECT value FROM json_each(:ids));

-- name: prune_run_digests
-- Up to :limit digest windows no run is a member of any more, sealed or ended before
-- :before (an open one a run may still join is kept).
DELETE FROM kirim_run_digests
WHERE rowid IN (
    SELECT w.rowid FROM kirim_run_digests w
    WHERE (w.sealed_at IS NOT NULL OR w.window_end < :before)
      AND NOT EXISTS (SELECT 1 FROM kirim_run_digest_members m
                      WHERE m.stream = w.stream AND m.window_start = w.window_start)
    LIMIT :limit
);
