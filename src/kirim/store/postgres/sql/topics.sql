-- Topics, subscriptions and fan-outs (kirim.store.topics), PostgreSQL. Named parameters
-- (%(name)s). A topic's change (subscribe, unsubscribe, an event) starts with
-- bump_topic, whose upsert locks the topic's row until the commit: the changes of one
-- topic are serialized and their numbers follow their commits. Recipients are ordered
-- bytewise (COLLATE "C"), as SQLite orders them.

-- name: bump_topic
-- The topic's next change number (the topic made at 1 if new), its row locked.
INSERT INTO kirim_topics AS t (topic, seq, created_at)
VALUES (%(topic)s, 1, %(now)s::float8)
ON CONFLICT (topic) DO UPDATE SET seq = t.seq + 1
RETURNING seq;

-- name: live_subscription
-- The recipient's live subscription to the topic, if any.
SELECT * FROM kirim_topic_subscriptions
WHERE topic = %(topic)s AND recipient_id = %(recipient_id)s AND removed_seq IS NULL;

-- name: add_subscription
-- A new subscription, live from change number %(seq)s.
INSERT INTO kirim_topic_subscriptions (topic, recipient_id, added_seq, added_at)
VALUES (%(topic)s, %(recipient_id)s, %(seq)s, %(now)s::float8)
RETURNING *;

-- name: end_subscription
-- End the recipient's live subscription at change number %(seq)s (the row stays).
UPDATE kirim_topic_subscriptions SET removed_seq = %(seq)s, removed_at = %(now)s::float8
WHERE topic = %(topic)s AND recipient_id = %(recipient_id)s AND removed_seq IS NULL;

-- name: topics_of
-- The topics a recipient is subscribed to now.
SELECT topic FROM kirim_topic_subscriptions
WHERE recipient_id = %(recipient_id)s AND removed_seq IS NULL ORDER BY topic COLLATE "C";

-- name: subscribers_now
-- A page of the topic's subscribers now, after %(after)s ('' : from the first).
SELECT recipient_id FROM kirim_topic_subscriptions
WHERE topic = %(topic)s AND removed_seq IS NULL
  AND recipient_id COLLATE "C" > %(after)s::text COLLATE "C"
ORDER BY recipient_id COLLATE "C" LIMIT %(limit)s;

-- name: subscribers_at
-- A batch of a fan-out: the subscriptions live at change number %(mark)s, after
-- %(after)s (a recipient has at most one subscription live at any number).
SELECT recipient_id FROM kirim_topic_subscriptions
WHERE topic = %(topic)s AND recipient_id COLLATE "C" > %(after)s::text COLLATE "C"
  AND added_seq <= %(mark)s AND (removed_seq IS NULL OR removed_seq > %(mark)s)
ORDER BY recipient_id COLLATE "C" LIMIT %(limit)s;

-- name: list_topics
-- Topics by name with their subscribers now.
SELECT t.topic, t.seq, t.created_at,
       (SELECT count(*) FROM kirim_topic_subscriptions s
        WHERE s.topic = t.topic AND s.removed_seq IS NULL) AS subscribers
FROM kirim_topics t ORDER BY t.topic COLLATE "C" LIMIT %(limit)s;

-- name: topic_row
-- One topic with its subscribers now.
SELECT t.topic, t.seq, t.created_at,
       (SELECT count(*) FROM kirim_topic_subscriptions s
        WHERE s.topic = t.topic AND s.removed_seq IS NULL) AS subscribers
FROM kirim_topics t WHERE t.topic = %(topic)s;

-- name: recent_topic_events
-- The topic's latest events, newest first.
SELECT * FROM kirim_topic_events WHERE topic = %(topic)s ORDER BY id DESC LIMIT %(limit)s;

-- name: latest_topic_events
-- The latest events of every topic, newest first.
SELECT * FROM kirim_topic_events ORDER BY id DESC LIMIT %(limit)s;

-- name: find_topic_event
-- The event of this type and id to this topic, if recorded, or what its tombstone
-- keeps of it once pruned (done, its data gone: kirim.store.retention_records).
SELECT * FROM kirim_topic_events
WHERE type = %(type)s AND event_id = %(event_id)s AND topic = %(topic)s
UNION ALL
SELECT id, topic, type, event_id, 'null' AS data, mark, 'done' AS status,
       NULL AS cursor, batches, recipients, NULL AS lease_owner, NULL AS lease_token,
       NULL::float8 AS lease_expires_at, created_at,
       coalesce(finished_at, created_at) AS updated_at, finished_at,
       NULL::float8 AS canceled_at, NULL::text AS cancel_why
FROM kirim_topic_event_tombstones t
WHERE t.type = %(type)s AND t.event_id = %(event_id)s AND t.topic = %(topic)s
  AND NOT EXISTS (SELECT 1 FROM kirim_topic_events e
                  WHERE e.type = %(type)s AND e.event_id = %(event_id)s
                    AND e.topic = %(topic)s);

-- name: add_topic_event
-- Record a topic event with its mark, expanding.
INSERT INTO kirim_topic_events (topic, type, event_id, data, mark, status, created_at,
                                updated_at)
VALUES (%(topic)s, %(type)s, %(event_id)s, %(data)s, %(mark)s, 'expanding',
        %(now)s::float8, %(now)s::float8)
RETURNING *;

-- name: claim_topic_event
-- Lease the oldest expanding topic event whose lease is free or expired (skipping one
-- another claim holds).
WITH due AS (
    SELECT id FROM kirim_topic_events
    WHERE status = 'expanding'
      AND (lease_expires_at IS NULL OR lease_expires_at <= %(now)s::float8)
    ORDER BY id LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE kirim_topic_events e
SET lease_owner = %(owner)s, lease_token = %(token)s, lease_expires_at = %(expires)s::float8,
    updated_at = %(now)s::float8
FROM due WHERE e.id = due.id
RETURNING e.*;

-- name: advance_topic_event
-- A batch done: the cursor moved from %(before)s to %(cursor)s, fenced by the lease
-- token and the cursor the batch was read after; the lease renewed, or let go when done.
UPDATE kirim_topic_events
SET cursor = %(cursor)s, batches = batches + 1, recipients = recipients + %(n)s,
    status = %(status)s, updated_at = %(now)s::float8,
    finished_at = CASE WHEN %(status)s::text = 'done' THEN %(now)s::float8 END,
    lease_expires_at = CASE WHEN %(status)s::text = 'done' THEN NULL
                            ELSE %(expires)s::float8 END
WHERE id = %(id)s AND lease_token = %(token)s AND status = 'expanding'
  AND cursor IS NOT DISTINCT FROM %(before)s::text
RETURNING canceled_at, cancel_why;

-- name: expanding_topic_events_of
-- The topic events of a type still fanning out and not canceled, with their data (a
-- cancellation reads its cancel_key's value there).
SELECT id, data FROM kirim_topic_events
WHERE type = %(type)s AND status = 'expanding' AND canceled_at IS NULL ORDER BY id;

-- name: cancel_topic_event
-- Mark a topic event still fanning out canceled: its later batches start their runs
-- canceled (the first cancellation's reason is kept). Its row lock waits for a batch
-- of its fan-out under way, whose runs the cancellation then reads.
UPDATE kirim_topic_events SET canceled_at = %(now)s::float8, cancel_why = %(why)s
WHERE id = %(id)s AND status = 'expanding' AND canceled_at IS NULL;

-- name: topic_events_expanding
-- How many topic events are still expanding.
SELECT count(*) AS n FROM kirim_topic_events WHERE status = 'expanding';

-- name: topic_counts
-- Topics, live subscriptions, and topic events pending (no batch yet), expanding, done.
SELECT (SELECT count(*) FROM kirim_topics) AS topics,
       (SELECT count(*) FROM kirim_topic_subscriptions WHERE removed_seq IS NULL)
           AS subscriptions,
       (SELECT count(*) FROM kirim_topic_events WHERE status = 'expanding' AND batches = 0)
           AS pending,
       (SELECT count(*) FROM kirim_topic_events WHERE status = 'expanding' AND batches > 0)
           AS expanding,
       (SELECT count(*) FROM kirim_topic_events WHERE status = 'done') AS done;
