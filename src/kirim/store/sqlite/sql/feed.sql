-- The in-app inbox's feeds (kirim.store.feed), SQLite. Named parameters (:name); a set
-- of ids or records is one JSON array (json_each). What a mark becomes is decided in
-- Python (kirim.store.feed.marks_after); these statements read and write rows.

-- name: insert_feed
-- Messages into their recipients' feeds, in the finish that marks their deliveries
-- sent; one already there (its recipient and key) is left as it is.
INSERT INTO kirim_feed (recipient_id, delivery_id, idempotency_key, type, title, body,
                        action_url, data, created_at)
SELECT value ->> 'recipient_id', value ->> 'delivery_id', value ->> 'idempotency_key',
       value ->> 'type', value ->> 'title', value ->> 'body', value ->> 'action_url',
       value ->> 'data', value ->> 'created_at'
FROM json_each(:items) WHERE true
ORDER BY key
ON CONFLICT (recipient_id, idempotency_key) DO NOTHING
RETURNING id, recipient_id, idempotency_key;

-- name: feed_page
-- One page of a recipient's feed, newest first, older than the cursor :before;
-- :archived is no, yes or any; :unseen, :unread keep only those without the mark.
SELECT * FROM kirim_feed
WHERE recipient_id = :recipient_id AND id < :before AND deleted_at IS NULL
  AND CASE :archived WHEN 'no' THEN archived_at IS NULL
                     WHEN 'yes' THEN archived_at IS NOT NULL ELSE 1 END
  AND (NOT :unseen OR seen_at IS NULL)
  AND (NOT :unread OR read_at IS NULL)
ORDER BY id DESC
LIMIT :limit;

-- name: feed_counts
-- A recipient's messages not archived: how many are not seen, how many not read.
SELECT coalesce(sum(seen_at IS NULL), 0) AS unseen, coalesce(sum(read_at IS NULL), 0) AS unread
FROM kirim_feed
WHERE recipient_id = :recipient_id AND archived_at IS NULL AND deleted_at IS NULL;

-- name: lock_feed_item
-- One message of a recipient's (the transaction holds the write lock).
SELECT * FROM kirim_feed
WHERE id = :id AND recipient_id = :recipient_id AND deleted_at IS NULL;

-- name: write_feed_marks
-- One message's marks as the action left them.
UPDATE kirim_feed SET seen_at = :seen_at, read_at = :read_at, archived_at = :archived_at
WHERE id = :id
RETURNING *;

-- name: feed_mark_seen
-- Mark seen those of a recipient's messages (:every, or the :ids) not seen yet.
UPDATE kirim_feed SET seen_at = :now
WHERE recipient_id = :recipient_id AND seen_at IS NULL AND deleted_at IS NULL
  AND (:every OR id IN (SELECT value FROM json_each(:ids)));

-- name: feed_mark_read
-- Mark read (and seen, if not yet) those of a recipient's messages not read yet.
UPDATE kirim_feed SET read_at = :now, seen_at = coalesce(seen_at, :now)
WHERE recipient_id = :recipient_id AND read_at IS NULL AND deleted_at IS NULL
  AND (:every OR id IN (SELECT value FROM json_each(:ids)));

-- name: feed_mark_archived
-- Archive those of a recipient's messages not archived yet.
UPDATE kirim_feed SET archived_at = :now
WHERE recipient_id = :recipient_id AND archived_at IS NULL AND deleted_at IS NULL
  AND (:every OR id IN (SELECT value FROM json_each(:ids)));

-- name: delete_feed_item
-- Delete one message of a recipient's: its row stays, emptied, so that its key stays
-- taken (retention removes it).
UPDATE kirim_feed
SET deleted_at = :now, title = NULL, body = NULL, action_url = NULL, data = NULL
WHERE id = :id AND recipient_id = :recipient_id AND deleted_at IS NULL;
