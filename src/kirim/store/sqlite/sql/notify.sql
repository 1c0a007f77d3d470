-- The notification layer's ledger (kirim.store.throttle, kirim.store.digests,
-- kirim.store.rates): throttle counters, digests and their events, provider request
-- rates. Named parameters; every write runs under the database's write lock.

-- name: take_throttle
-- One slot of a throttle window, if it has room: the count after it (no row: full).
-- The window's end is kept for prune (a counter of an ended window goes).
INSERT INTO kirim_throttle (scope, window_start, window_end, count)
SELECT :scope, :window_start, :window_end, 1 WHERE :limit >= 1
ON CONFLICT (scope, window_start) DO UPDATE SET count = count + 1
WHERE kirim_throttle.count < :limit
RETURNING count;

-- name: full_throttle_windows
-- The full windows of a throttle from :after_start on, in order (at most :n): the ones
-- ``defer`` skips while it looks for room (kirim.store.throttle).
SELECT window_start FROM kirim_throttle
WHERE scope = :scope AND window_start >= :after_start AND count >= :limit
ORDER BY window_start LIMIT :n;

-- name: throttled_deliveries
-- Deliveries over their throttle (run per record :id): suppressed, with the reason.
UPDATE kirim_deliveries SET status = 'suppressed', reason = :reason, updated_at = :now
WHERE id = :id AND status = 'pending';

-- name: throttled_jobs
-- ... and their jobs completed (run per record :id, the delivery's id).
UPDATE kirim_jobs SET status = 'completed', last_error = :error, updated_at = :now
WHERE delivery_id = :id AND status = 'queued';

-- name: deferred_jobs
-- Jobs moved to the throttle window that had room (run per record :id, :run_at).
UPDATE kirim_jobs SET run_at = :run_at, updated_at = :now WHERE id = :id;

-- name: digest_event
-- The digest that holds an event of a stream, if one does (pruned_at: that digest was
-- pruned, the row kept for its dedup).
SELECT id, digest_key, pruned_at FROM kirim_digest_events
WHERE stream = :stream AND event_id = :event_id;

-- name: forget_digest_event
-- An event of a pruned digest whose key tombstone has expired: the event is free again.
DELETE FROM kirim_digest_events WHERE id = :id AND pruned_at IS NOT NULL;

-- name: open_digest
-- The digest of a stream for one window, made if new (its delivery is made after).
INSERT INTO kirim_digests (key, stream, window_start, window_end, created_at)
VALUES (:key, :stream, :window_start, :window_end, :now)
ON CONFLICT (key) DO UPDATE SET sealed_at = kirim_digests.sealed_at
RETURNING *;

-- name: add_digest_event
-- An event into a digest, once per stream (no row: the stream has it already).
INSERT INTO kirim_digest_events (stream, event_id, digest_key, data, created_at)
VALUES (:stream, :event_id, :digest_key, :data, :now)
ON CONFLICT (stream, event_id) DO NOTHING
RETURNING id;

-- name: insert_digest_delivery
-- A digest's delivery, its key derived from the stream and window, unless the key
-- exists or its tombstone is kept.
INSERT INTO kirim_deliveries
    (idempotency_key, event_id, recipient, channel, payload, payload_hash, status,
     type, recipient_id, created_at, updated_at)
SELECT :key, :event_id, :recipient, :channel, :payload, :payload_hash, 'pending',
       :type, :recipient_id, :now, :now
WHERE NOT EXISTS (SELECT 1 FROM kirim_key_tombstones WHERE key_hash = :key_hash)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING *;

-- name: insert_digest_job
-- The job of a digest's delivery, due when its window ends.
INSERT INTO kirim_jobs (delivery_id, status, run_at, max_attempts, created_at, updated_at)
VALUES (:delivery_id, 'queued', :run_at, :max_attempts, :now, :now)
RETURNING *;

-- name: link_digest
-- A digest's delivery, recorded on the digest.
UPDATE kirim_digests SET delivery_id = :delivery_id WHERE key = :key;

-- name: mark_digest_pruned
-- A digest made again for a key whose delivery was pruned (its tombstone is kept): it
-- is pruned too, when that delivery was (prune empties its events, then deletes it).
UPDATE kirim_digests
SET pruned_at = (SELECT pruned_at FROM kirim_key_tombstones WHERE key_hash = :key_hash)
WHERE key = :key AND pruned_at IS NULL;

-- name: digest_delivery
-- A digest's delivery (by its key) with its most recent job (job_ columns).
SELECT d.*,
       j.id AS job_id, j.delivery_id AS job_delivery_id, j.status AS job_status,
       j.run_at AS job_run_at, j.attempts AS job_attempts, j.max_attempts AS job_max_attempts,
       j.lease_owner AS job_lease_owner, j.lease_token AS job_lease_token,
       j.lease_expires_at AS job_lease_expires_at, j.last_error AS job_last_error,
       j.created_at AS job_created_at, j.updated_at AS job_updated_at
FROM kirim_deliveries d
LEFT JOIN kirim_jobs j
    ON j.id = (SELECT max(id) FROM kirim_jobs WHERE delivery_id = d.id)
WHERE d.idempotency_key = :key;

-- name: digest_tombstone
-- The tombstone of a digest's pruned delivery, by its key's sha256.
SELECT * FROM kirim_key_tombstones WHERE key_hash = :key_hash;

-- name: lock_digest_of
-- The digest whose delivery this is (its key is the delivery's idempotency key).
SELECT * FROM kirim_digests
WHERE key = (SELECT idempotency_key FROM kirim_deliveries WHERE id = :delivery_id);

-- name: digest_events_of
-- A digest's events, oldest first.
SELECT * FROM kirim_digest_events WHERE digest_key = :key ORDER BY id;

-- name: seal_digest
-- Seal a digest: later events of its stream go to the next window's.
UPDATE kirim_digests SET sealed_at = :now WHERE key = :key AND sealed_at IS NULL;

-- name: write_digest_payload
-- A digest's delivery gets the payload composed of its events.
UPDATE kirim_deliveries SET payload = :payload, payload_hash = :payload_hash, updated_at = :now
WHERE id = :id;

-- name: take_rate_slot
-- The next request slot of a channel, :interval seconds after the one before (or now),
-- taken only when it is at most :within seconds away: how long to wait for it (no row:
-- too far, not taken).
INSERT INTO kirim_rates (channel, next_at) VALUES (:channel, :now + :interval)
ON CONFLICT (channel) DO UPDATE SET next_at = max(kirim_rates.next_at, :now) + :interval
WHERE max(kirim_rates.next_at, :now) - :now <= :within
RETURNING next_at - :interval - :now AS wait;

-- name: rate_slot_wait
-- How far away a channel's next request slot is (not taking it).
SELECT max(next_at - :now, 0.0) AS wait FROM kirim_rates WHERE channel = :channel;
