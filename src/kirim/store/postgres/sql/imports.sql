-- Keys another system sent, imported as tombstones (kirim.store.imports).

-- name: import_key_tombstones
-- A tombstone (delivery id 0, status sent, written at :now) for each item (key,
-- key_hash) whose key has neither a delivery nor a tombstone.
INSERT INTO kirim_key_tombstones (key_hash, delivery_id, status, seen_at, pruned_at)
SELECT u.key_hash, 0, 'sent', %(now)s, %(now)s
FROM unnest(%(i_key)s::text[], %(i_key_hash)s::text[]) AS u (key, key_hash)
WHERE NOT EXISTS (SELECT 1 FROM kirim_deliveries d WHERE d.idempotency_key = u.key)
ON CONFLICT (key_hash) DO NOTHING;

-- name: import_count_known
-- A dry run: how many items (key, key_hash) kirim holds already, as a delivery or a
-- tombstone.
SELECT COUNT(*) AS n
FROM unnest(%(i_key)s::text[], %(i_key_hash)s::text[]) AS u (key, key_hash)
WHERE EXISTS (SELECT 1 FROM kirim_deliveries d WHERE d.idempotency_key = u.key)
   OR EXISTS (SELECT 1 FROM kirim_key_tombstones t WHERE t.key_hash = u.key_hash);
