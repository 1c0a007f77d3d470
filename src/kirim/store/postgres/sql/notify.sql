-- The notification layer's ledger (kirim.store.throttle, kirim.store.digests,
-- kirim.store.rates): throttle counters, digests and their events, provider request
-- rates (psycopg placeholders; batches as arrays, i_<column>).
--
-- Locks: an upsert locks the row it finds (a second transaction waits for the first,
-- then sees its row: counts and seals are never lost); digests before the deliveries.

-- name: take_throttle
-- One slot of a throttle window, if it has room: the count after it (no row: full).
-- The window's end is kept for prune (a counter of an ended window goes).
INSERT INTO kirim_throttle (scope, window_start, window_end, count)
SELECT %(scope)s, %(window_start)s::float8, %(window_end)s::float8, 1
WHERE %(limit)s::int >= 1
ON CONFLICT (scope, window_start) DO UPDATE SET count = kirim_throttle.count + 1
WHERE kirim_throttle.count < %(limit)s::int
RETURNING count;

-- name: full_throttle_windows
-- The full windows of a throttle from after_start on, in order (at most n): the ones
-- ``defer`` skips while it looks for room (kirim.store.throttle).
SELECT window_start FROM kirim_throttle
WHERE scope = %(scope)s AND window_start >= %(after_start)s::float8
  AND count >= %(limit)s::int
ORDER BY window_start LIMIT %(n)s::int;

-- name: throttled_deliveries
-- Deliveries over their throttle: suppressed, with the reason.
UPDATE kirim_deliveries d SET status = 'suppressed', reason = %(reason)s,
    updated_at = %(now)s::float8
FROM unnest(%(i_id)s::bigint[]) AS u (id)
WHERE d.id = u.id AND d.status = 'pending';

-- name: throttled_jobs
-- ... and their jobs completed (i_id: the deliveries' ids).
UPDATE kirim_jobs j SET status = 'completed', last_error = %(error)s,
    updated_at = %(now)s::float8
FROM unnest(%(i_id)s::bigint[]) AS u (id)
WHERE j.delivery_id = u.id AND j.status = 'queued';

-- name: deferred_jobs
-- Jobs moved to the throttle window that had room.
UPDATE kirim_jobs j SET run_at = u.run_at, updated_at = %(now)s::float8
FROM unnest(%(i_id)s::bigint[], %(i_run_at)s::float8[]) AS u (id, run_at)
WHERE j.id = u.id;

-- name: digest_event
-- The digest that holds an event of a stream, if one does (pruned_at: that digest was
-- pruned, the row kept for its dedup).
SELECT id, digest_key, pruned_at FROM kirim_digest_events
WHERE stream = %(stream)s AND event_id = %(event_id)s;

-- name: forget_digest_event
-- An event of a pruned digest whose key tombstone has expired: the event is free again
-- (a concurrent enqueue of the same event waits for this delete, then finds no row).
DELETE FROM kirim_digest_events WHERE id = %(id)s AND pruned_at IS NOT NULL;

-- name: open_digest
-- The digest of a stream for one window, made if new, its row locked (a concurrent
-- seal waits for this transaction, or this one for the seal and sees it sealed).
INSERT INTO kirim_digests (key, stream, window_start, window_end, created_at)
VALUES (%(key)s, %(stream)s, %(window_start)s::float8, %(window_end)s::float8,
        %(now)s::float8)
ON CONFLICT (key) DO UPDATE SET sealed_at = kirim_digests.sealed_at
RETURNING *;

-- name: add_digest_event
-- An event into a digest, once per stream (no row: the stream has it already; a
-- concurrent insert of the same event is waited for).
INSERT INTO kirim_digest_events (stream, event_id, digest_key, data, created_at)
VALUES (%(stream)s, %(event_id)s, %(digest_key)s, %(data)s, %(now)s::float8)
ON CONFLICT (stream, event_id) DO NOTHING
RETURNING id;

-- name: insert_digest_delivery
-- A digest's delivery, its key derived from the stream and window, unless the key
-- exists or its tombstone is kept.
INSERT INTO kirim_deliveries
    (idempotency_key, event_id, recipient, channel, payload, payload_hash, status,
     type, recipient_id, created_at, updated_at)
SELECT %(key)s, %(event_id)s, %(recipient)s, %(channel)s, %(payload)s, %(payload_hash)s,
       'pending', %(type)s, %(recipient_id)s, %(now)s::float8, %(now)s::float8
WHERE NOT EXISTS (SELECT 1 FROM kirim_key_tombstones WHERE key_hash = %(key_hash)s)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING *;

-- name: insert_digest_job
-- The job of a digest's delivery, due when its window ends.
INSERT INTO kirim_jobs (delivery_id, status, run_at, max_attempts, created_at, updated_at)
VALUES (%(delivery_id)s, 'queued', %(run_at)s::float8, %(max_attempts)s::int,
        %(now)s::float8, %(now)s::float8)
RETURNING *;

-- name: link_digest
-- A digest's delivery, recorded on the digest.
UPDATE kirim_digests SET delivery_id = %(delivery_id)s WHERE key = %(key)s;

-- name: mark_digest_pruned
-- A digest made again for a key whose delivery was pruned (its tombstone is kept): it
-- is pruned too, when that delivery was (prune empties its events, then deletes it).
UPDATE kirim_digests
SET pruned_at = (SELECT pruned_at FROM kirim_key_tombstones WHERE key_hash = %(key_hash)s)
WHERE key = %(key)s AND pruned_at IS NULL;

-- name: digest_delivery
-- A digest's delivery (by its key) with its most recent job (job_ columns).
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
WHERE d.idempotency_key = %(key)s;

-- name: digest_tombstone
-- The tombstone of a digest's pruned delivery, by its key's sha256.
SELECT * FROM kirim_key_tombstones WHERE key_hash = %(key_hash)s;

-- name: lock_digest_of
-- Lock the digest whose delivery this is (its key is the delivery's idempotency key):
-- an event being added to it is waited for.
SELECT * FROM kirim_digests
WHERE key = (SELECT idempotency_key FROM kirim_deliveries WHERE id = %(delivery_id)s)
FOR NO KEY UPDATE;

-- name: digest_events_of
-- A digest's events, oldest first.
SELECT * FROM kirim_digest_events WHERE digest_key = %(key)s ORDER BY id;

-- name: seal_digest
-- Seal a digest: later events of its stream go to the next window's.
UPDATE kirim_digests SET sealed_at = %(now)s::float8
WHERE key = %(key)s AND sealed_at IS NULL;

-- name: write_digest_payload
-- A digest's delivery gets the payload composed of its events.
UPDATE kirim_deliveries
SET payload = %(payload)s, payload_hash = %(payload_hash)s, updated_at = %(now)s::float8
WHERE id = %(id)s;

-- name: take_rate_slot
-- The next request slot of a channel, %(interval)s seconds after the one before (or
-- now), taken only when it is at most %(within)s seconds away: how long to wait for it
-- (no row: too far, not taken). Every worker on the database shares the row.
INSERT INTO kirim_rates (channel, next_at)
VALUES (%(channel)s, %(now)s::float8 + %(interval)s::float8)
ON CONFLICT (channel) DO UPDATE
SET next_at = greatest(kirim_rates.next_at, %(now)s::float8) + %(interval)s::float8
WHERE greatest(kirim_rates.next_at, %(now)s::float8) - %(now)s::float8 <= %(within)s::float8
RETURNING next_at - %(interval)s::float8 - %(now)s::float8 AS wait;

-- name: rate_slot_wait
-- How far away a channel's next request slot is (not taking it).
SELECT greatest(next_at - %(now)s::float8, 0.0) AS wait FROM kirim_rates
WHERE channel = %(channel)s;
