-- The order of the feeds' changes (kirim.store.feed_changes), PostgreSQL: the numbers
-- the triggers of 0011_feed_changes.sql give every feed write.

-- name: feed_changes
-- The rows of a recipient's feed written after a number, in the order of their last write.
SELECT * FROM kirim_feed
WHERE recipient_id = %(recipient_id)s AND changed_seq > %(after)s::bigint
ORDER BY changed_seq
LIMIT %(limit)s;

-- name: feed_head
-- The number of a recipient's last feed write.
SELECT max(changed_seq) AS head FROM kirim_feed WHERE recipient_id = %(recipient_id)s;

-- name: feed_last_number
-- The last number given to any feed write (streams use LISTEN here, not this).
SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END AS head
FROM kirim_feed_change_seq;
