-- Delivery callbacks (kirim.store.transitions.confirm), PostgreSQL. Named parameters
-- (%(name)s); a set is an array. These statements only find, read and write rows: what
-- a callback does to a delivery is decided in rules.confirmed (after lock_deliveries).

-- name: callback_find
-- The delivery a callback to %(channel)s names: by the provider's message id (the
-- delivery's, an attempt's, or one an earlier callback confirmed), else by the
-- idempotency key the callback carries (%(key)s, may be null). The best match first. A
-- delivery is %(channel)s's when it is of that channel or one of its attempts went to that
-- channel's provider (a fallback: failover, docs/channels.md). The message ids the
-- deliveries and attempts recorded are found through kirim_message_ids (written once;
-- no index names the columns a finish sets), and checked on the rows as they are.
SELECT id, rank FROM (
    SELECT d.id, 1 AS rank FROM kirim_message_ids m
    JOIN kirim_deliveries d ON d.id = m.delivery_id
    WHERE m.message_id = %(message_id)s AND d.provider_message_id = %(message_id)s
      AND (d.channel = %(channel)s OR EXISTS (
        SELECT 1 FROM kirim_attempts a WHERE a.delivery_id = d.id AND a.provider = %(channel)s))
    UNION ALL
    SELECT a.delivery_id, 2 FROM kirim_message_ids m
    JOIN kirim_attempts a ON a.delivery_id = m.delivery_id
    JOIN kirim_deliveries d ON d.id = a.delivery_id
    WHERE m.message_id = %(message_id)s AND a.provider_message_id = %(message_id)s
      AND coalesce(a.provider, d.channel) = %(channel)s
    UNION ALL
    SELECT c.delivery_id, 3 FROM kirim_confirmations c
    JOIN kirim_deliveries d ON d.id = c.delivery_id
    WHERE c.message_id = %(message_id)s AND (d.channel = %(channel)s OR EXISTS (
        SELECT 1 FROM kirim_attempts a WHERE a.delivery_id = d.id AND a.provider = %(channel)s))
    UNION ALL
    SELECT d.id, 4 FROM kirim_deliveries d
    WHERE %(key)s::text IS NOT NULL AND d.idempotency_key = %(key)s::text
      AND (d.channel = %(channel)s OR EXISTS (
        SELECT 1 FROM kirim_attempts a WHERE a.delivery_id = d.id AND a.provider = %(channel)s))
) AS found
ORDER BY rank, id
LIMIT 1;

-- name: confirmations_of
-- Every message id confirmed for these deliveries, oldest first (read after their
-- deliveries are locked: a concurrent callback for the same delivery has committed).
SELECT * FROM kirim_confirmations
WHERE delivery_id = ANY (%(ids)s::bigint[])
ORDER BY delivery_id, id;

-- name: write_confirmation
-- A message id confirmed for a delivery, or the provider's new word on one it had.
INSERT INTO kirim_confirmations
    (delivery_id, message_id, status, reason, reported_at, received_at, updated_at)
VALUES (%(delivery_id)s, %(message_id)s, %(status)s, %(reason)s, %(reported_at)s::float8,
        %(now)s::float8, %(now)s::float8)
ON CONFLICT (delivery_id, message_id) DO UPDATE
SET status = excluded.status, reason = excluded.reason, reported_at = excluded.reported_at,
    updated_at = excluded.updated_at;

-- name: prune_delete_confirmations
-- The confirmations of these deliveries (retention, before the deliveries).
DELETE FROM kirim_confirmations WHERE delivery_id = ANY (%(ids)s::bigint[]);

-- name: keep_callback
-- A callback for a message no delivery has recorded yet: kept (once per message and
-- word) until its delivery is found, or for a day.
INSERT INTO kirim_callback_inbox
    (channel, message_id, status, key, reason, reported_at, received_at)
VALUES (%(channel)s, %(message_id)s, %(status)s, %(key)s, %(reason)s, %(reported_at)s,
        %(now)s)
ON CONFLICT (channel, message_id, status) DO NOTHING;

-- name: kept_callbacks
-- The oldest kept callbacks (another transaction applying some: skipped).
SELECT * FROM kirim_callback_inbox ORDER BY received_at, id LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: forget_kept_callbacks
-- Kept callbacks applied, or kept too long.
DELETE FROM kirim_callback_inbox WHERE id = ANY (%(ids)s::bigint[]);

-- name: write_message_ids
-- The provider message ids a transition recorded, one row per (delivery, message id),
-- written once (callback_find reads them).
INSERT INTO kirim_message_ids (delivery_id, message_id)
SELECT u.delivery_id, u.message_id
FROM unnest(%(i_delivery_id)s::bigint[], %(i_message_id)s::text[]) AS u (delivery_id, message_id)
ON CONFLICT DO NOTHING;

-- name: prune_delete_message_ids
-- The message ids of these deliveries (retention).
DELETE FROM kirim_message_ids WHERE delivery_id = ANY (%(ids)s::bigint[]);
