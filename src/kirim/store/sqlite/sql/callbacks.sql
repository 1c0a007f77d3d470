-- Delivery callbacks (kirim.store.transitions.confirm), SQLite. Named parameters (:name);
-- a set is one JSON parameter (:ids, json_each). These statements only find, read and
-- write rows: what a callback does to a delivery is decided in rules.confirmed.

-- name: callback_find
-- The delivery a callback to :channel names: by the provider's message id (the
-- delivery's, an attempt's, or one an earlier callback confirmed), else by the
-- idempotency key the callback carries (:key, may be null). The best match first. A
-- delivery is :channel's when it is of that channel or one of its attempts went to that
-- channel's provider (a fallback: failover, docs/channels.md). The message ids the
-- deliveries and attempts recorded are found through kirim_message_ids (written once;
-- no index names the columns a finish sets), and checked on the rows as they are.
SELECT id, rank FROM (
    SELECT d.id, 1 AS rank FROM kirim_message_ids m
    JOIN kirim_deliveries d ON d.id = m.delivery_id
    WHERE m.message_id = :message_id AND d.provider_message_id = :message_id
      AND (d.channel = :channel OR EXISTS (
        SELECT 1 FROM kirim_attempts a WHERE a.delivery_id = d.id AND a.provider = :channel))
    UNION ALL
    SELECT a.delivery_id, 2 FROM kirim_message_ids m
    JOIN kirim_attempts a ON a.delivery_id = m.delivery_id
    JOIN kirim_deliveries d ON d.id = a.delivery_id
    WHERE m.message_id = :message_id AND a.provider_message_id = :message_id
      AND coalesce(a.provider, d.channel) = :channel
    UNION ALL
    SELECT c.delivery_id, 3 FROM kirim_confirmations c
    JOIN kirim_deliveries d ON d.id = c.delivery_id
    WHERE c.message_id = :message_id AND (d.channel = :channel OR EXISTS (
        SELECT 1 FROM kirim_attempts a WHERE a.delivery_id = d.id AND a.provider = :channel))
    UNION ALL
    SELECT d.id, 4 FROM kirim_deliveries d
    WHERE :key IS NOT NULL AND d.idempotency_key = :key
      AND (d.channel = :channel OR EXISTS (
        SELECT 1 FROM kirim_attempts a WHERE a.delivery_id = d.id AND a.provider = :channel))
) AS found
ORDER BY rank, id
LIMIT 1;

-- name: confirmations_of
-- Every message id confirmed for these deliveries, oldest first.
SELECT * FROM kirim_confirmations
WHERE delivery_id IN (SELECT value FROM json_each(:ids))
ORDER BY delivery_id, id;

-- name: write_confirmation
-- A message id confirmed for a delivery, or the provider's new word on one it had.
INSERT INTO kirim_confirmations
    (delivery_id, message_id, status, reason, reported_at, received_at, updated_at)
VALUES (:delivery_id, :message_id, :status, :reason, :reported_at, :now, :now)
ON CONFLICT (delivery_id, message_id) DO UPDATE
SET status = excluded.status, reason = excluded.reason, reported_at = excluded.reported_at,
    updated_at = excluded.updated_at;

-- name: prune_delete_confirmations
-- The confirmations of these deliveries (retention, before the deliveries).
DELETE FROM kirim_confirmations WHERE delivery_id IN (SELECT value FROM json_each(:ids));

-- name: keep_callback
-- A callback for a message no delivery has recorded yet: kept (once per message and
-- word) until its delivery is found, or for a day.
INSERT INTO kirim_callback_inbox
    (channel, message_id, status, key, reason, reported_at, received_at)
VALUES (:channel, :message_id, :status, :key, :reason, :reported_at, :now)
ON CONFLICT (channel, message_id, status) DO NOTHING;

-- name: kept_callbacks
-- The oldest kept callbacks.
SELECT * FROM kirim_callback_inbox ORDER BY received_at, id LIMIT coalesce(:limit, -1);

-- name: forget_kept_callbacks
-- Kept callbacks applied, or kept too long.
DELETE FROM kirim_callback_inbox WHERE id IN (SELECT value FROM json_each(:ids));

-- name: write_message_ids
-- The provider message ids a transition recorded, one row per (delivery, message id),
-- written once (callback_find reads them; executemany).
INSERT OR IGNORE INTO kirim_message_ids (delivery_id, message_id)
VALUES (:delivery_id, :message_id);

-- name: prune_delete_message_ids
-- The message ids of these deliveries (retention).
DELETE FROM kirim_message_ids WHERE delivery_id IN (SELECT value FROM json_each(:ids));
