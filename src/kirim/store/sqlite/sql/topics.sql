-- Topics, subscriptions and fan-outs (kirim.store.topics), SQLite. Named parameters
-- (:name). Every write runs inside BEGIN IMMEDIATE (the database's write lock from the
-- first statement): a topic's change numbers follow the commits by themselves.

-- name: bump_topic
-- The topic's next change number (the topic made at 1 if new).
INSERT INTO kirim_topics (topic, seq, created_at) VALUES (:topic, 1, :now)
ON CONFLICT (topic) DO UPDATE SET seq = kirim_topics.seq + 1
RETURNING seq;

-- name: live_subscription
-- The recipient's live subscription to the topic, if any.
SELECT * FROM kirim_topic_subscriptions
WHERE topic = :topic AND recipient_id = :recipient_id AND removed_seq IS NULL;

-- name: add_subscription
-- A new subscription, live from change number :seq.
INSERT INTO kirim_topic_subscriptions (topic, recipient_id, added_seq, added_at)
VALUES (:topic, :recipient_id, :seq, :now)
RETURNING *;

-- name: end_subscription
-- End the recipient's live subscription at change number :seq (the row stays).
UPDATE kirim_topic_subscriptions SET removed_seq = :seq, removed_at = :now
WHERE topic = :topic AND recipient_id = :recipient_id AND removed_seq IS NULL;

-- name: topics_of
-- The topics a recipient is subscribed to now.
SELECT topic FROM kirim_topic_subscriptions
WHERE recipient_id = :recipient_id AND removed_seq IS NULL ORDER BY topic;

-- name: subscribers_now
-- A page of the topic's subscribers now, after :after ('' : from the first).
SELECT recipient_id FROM kirim_topic_subscriptions
WHERE topic = :topic AND removed_seq IS NULL AND recipient_id > :after
ORDER BY recipient_id LIMIT :limit;

-- name: subscribers_at
-- A batch of a fan-out: the subscriptions live at change number :mark, after :after
-- (a recipient has at most one subscription live at any number).
SELECT recipient_id FROM kirim_topic_subscriptions
WHERE topic = :topic AND recipient_id > :after AND added_seq <= :mark
  AND (removed_seq IS NULL OR removed_seq > :mark)
ORDER BY recipient_id LIMIT :limit;

-- name: list_topics
-- Topics by name with their subscribers now.
SELECT t.topic, t.seq, t.created_at,
       (SELECT count(*) FROM kirim_topic_subscriptions s
        WHERE s.topic = t.topic AND s.removed_seq IS NULL) AS subscribers
FROM kirim_topics t ORDER BY t.topic LIMIT :limit;

-- name: topic_row
-- One topic with its subscribers now.
SELECT t.topic, t.seq, t.created_at,
       (SELECT count(*) FROM kirim_topic_subscriptions s
        WHERE s.topic = t.topic AND s.removed_seq IS NULL) AS subscribers
FROM kirim_topics t WHERE t.topic = :topic;

-- name: recent_topic_events
-- The topic's latest events, newest first.
SELECT * FROM kirim_topic_events WHERE topic = :topic ORDER BY id DESC LIMIT :limit;

-- name: latest_topic_events
-- The latest events of every topic, newest first.
SELECT * FROM kirim_topic_events ORDER BY id DESC LIMIT :limit;

-- name: find_topic_event
-- The event of this type and id to this topic, if recorded, or what its tombstone
-- keeps of it once pruned (done, its data gone: kirim.store.retention_records).
SELECT * FROM kirim_topic_events
WHERE type = :type AND event_id = :event_id AND topic = :topic
UNION ALL
SELECT id, topic, type, event_id, 'null' AS data, mark, 'done' AS status, NULL AS cursor,
       batches, recipients, NULL AS lease_owner, NULL AS lease_token,
       NULL AS lease_expires_at, created_at, coalesce(finished_at, created_at) AS updated_at,
       finished_at, NULL AS canceled_at, NULL AS cancel_why
FROM kirim_topic_event_tombstones t
WHERE t.type = :type AND t.event_id = :event_id AND t.topic = :topic
  AND NOT EXISTS (SELECT 1 FROM kirim_topic_events e
                  WHERE e.type = :type AND e.event_id = :event_id AND e.topic = :topic);

-- name: add_topic_event
-- Record a topic event with its mark, expanding.
INSERT INTO kirim_topic_events (topic, type, event_id, data, mark, status, created_at,
                                updated_at)
VALUES (:topic, :type, :event_id, :data, :mark, 'expanding', :now, :now)
RETURNING *;

-- name: claim_topic_event
-- Lease the oldest expanding topic event whose lease is free or expired.
UPDATE kirim_topic_events
SET lease_owner = :owner, lease_token = :token, lease_expires_at = :expires,
    updated_at = :now
WHERE id = (SELECT id FROM kirim_topic_events
            WHERE status = 'expanding'
              AND (lease_expires_at IS NULL OR lease_expires_at <= :now)
            ORDER BY id LIMIT 1)
RETURNING *;

-- name: advance_topic_event
-- A batch done: the cursor moved from :before to :cursor, fenced by the lease token
-- and the cursor the batch was read after; the lease renewed, or let go when done.
UPDATE kirim_topic_events
SET cursor = :cursor, batches = batches + 1, recipients = recipients + :n,
    status = :status, updated_at = :now,
    finished_at = CASE WHEN :status = 'done' THEN :now END,
    lease_expires_at = CASE WHEN :status = 'done' THEN NULL ELSE :expires END
WHERE id = :id AND lease_token = :token AND status = 'expanding' AND cursor IS :before
RETURNING canceled_at, cancel_why;

-- name: expanding_topic_events_of
-- The topic events of a type still fanning out and not canceled, with their data (a
-- cancellation reads its cancel_key's value there).
SELECT id, data FROM kirim_topic_events
WHERE type = :type AND status = 'expanding' AND canceled_at IS NULL ORDER BY id;

-- name: cancel_topic_event
-- Mark a topic event still fanning out canceled: its later batches start their runs
-- canceled (the first cancellation's reason is kept).
UPDATE kirim_topic_events SET canceled_at = :now, cancel_why = :why
WHERE id = :id AND status = 'expanding' AND canceled_at IS NULL;

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
