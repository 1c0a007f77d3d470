-- The in-app inbox's feeds (kirim.store.feed), PostgreSQL. A set of ids is an array
-- (%(ids)s); the records of a step's items arrive as one array per column,
-- %(i_<column>)s (unnest). What a mark becomes is decided in Python
-- (kirim.store.feed.marks_after); these statements read and write rows. Every write
-- is followed by notify_feed in its transaction: other processes hear of it at the
-- commit (LISTEN kirim_feed; the payload is the recipient id).

-- name: insert_feed
-- Messages into their recipients' feeds, in the finish that marks their deliveries
-- sent; one already there (its recipient and key) is left as it is.
INSERT INTO kirim_feed (recipient_id, delivery_id, idempotency_key, type, title, body,
                        action_url, data, created_at)
SELECT recipient_id, delivery_id, idempotency_key, type, title, body, action_url, data,
       created_at
FROM unnest(
    %(i_recipient_id)s::text[], %(i_delivery_id)s::bigint[], %(i_idempotency_key)s::text[],
    %(i_type)s::text[], %(i_title)s::text[], %(i_body)s::text[], %(i_action_url)s::text[],
    %(i_data)s::text[], %(i_created_at)s::float8[]
) WITH ORDINALITY AS u (recipient_id, delivery_id, idempotency_key, type, title, body,
                        action_url, data, created_at, n)
-- by recipient: the numbering trigger (0011) locks each recipient in this order, the
-- same in every finish, so two finishes never wait on each other in a cycle
ORDER BY recipient_id, n
ON CONFLICT (recipient_id, idempotency_key) DO NOTHING
RETURNING id, recipient_id, idempotency_key;

-- name: notify_feed
-- Tell the processes that listen that these recipients' feeds changed (at commit).
SELECT pg_notify('kirim_feed', r) FROM unnest(%(recipients)s::text[]) AS r;

-- name: feed_page
-- One page of a recipient's feed, newest first, older than the cursor %(before)s;
-- %(archived)s is no, yes or any; %(unseen)s, %(unread)s keep only those without the mark.
SELECT * FROM kirim_feed
WHERE recipient_id = %(recipient_id)s AND id < %(before)s::bigint AND deleted_at IS NULL
  AND CASE %(archived)s::text WHEN 'no' THEN archived_at IS NULL
                              WHEN 'yes' THEN archived_at IS NOT NULL ELSE true END
  AND (NOT %(unseen)s::boolean OR seen_at IS NULL)
  AND (NOT %(unread)s::boolean OR read_at IS NULL)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: feed_counts
-- A recipient's messages not archived: how many are not seen, how many not read.
SELECT count(*) FILTER (WHERE seen_at IS NULL) AS unseen,
       count(*) FILTER (WHERE read_at IS NULL) AS unread
FROM kirim_feed
WHERE recipient_id = %(recipient_id)s AND archived_at IS NULL AND deleted_at IS NULL;

-- name: lock_feed_item
-- Lock and read one message of a recipient's.
SELECT * FROM kirim_feed
WHERE id = %(id)s::bigint AND recipient_id = %(recipient_id)s AND deleted_at IS NULL
FOR UPDATE;

-- name: write_feed_marks
-- One message's marks as the action left them.
UPDATE kirim_feed
SET seen_at = %(seen_at)s::float8, read_at = %(read_at)s::float8,
    archived_at = %(archived_at)s::float8
WHERE id = %(id)s::bigint
RETURNING *;

-- name: feed_mark_seen
-- Mark seen those of a recipient's messages (%(every)s, or the %(ids)s) not seen yet.
UPDATE kirim_feed SET seen_at = %(now)s::float8
WHERE recipient_id = %(recipient_id)s AND seen_at IS NULL AND deleted_at IS NULL
  AND (%(every)s::boolean OR id = ANY (%(ids)s::bigint[]));

-- name: feed_mark_read
-- Mark read (and seen, if not yet) those of a recipient's messages not read yet.
UPDATE kirim_feed SET read_at = %(now)s::float8, seen_at = coalesce(seen_at, %(now)s::float8)
WHERE recipient_id = %(recipient_id)s AND read_at IS NULL AND deleted_at IS NULL
  AND (%(every)s::boolean OR id = ANY (%(ids)s::bigint[]));

-- name: feed_mark_archived
-- Archive those of a recipient's messages not archived yet.
UPDATE kirim_feed SET archived_at = %(now)s::float8
WHERE recipient_id = %(recipient_id)s AND archived_at IS NULL AND deleted_at IS NULL
  AND (%(every)s::boolean OR id = ANY (%(ids)s::bigint[]));

-- name: delete_feed_item
-- Delete one message of a recipient's: its row stays, emptied, so that its key stays
-- taken (retention removes it).
UPDATE kirim_feed
SET deleted_at = %(now)s::float8, title = NULL, body = NULL, action_url = NULL, data = NULL
WHERE id = %(id)s::bigint AND recipient_id = %(recipient_id)s AND deleted_at IS NULL;
