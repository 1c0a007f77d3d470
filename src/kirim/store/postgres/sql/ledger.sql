-- After a lost connection (a failover, perhaps), a worker checks that the database
-- still has the intents it committed (src/kirim/store/postgres/ledger.py).

-- name: intents_missing
-- Of these intents (provider request ids with their deliveries), those whose delivery
-- is still there and whose attempt row is not: commits the database lost. (Retention
-- prunes a delivery with its attempts, so a pruned one is not counted.)
SELECT x.request_id, x.delivery_id
FROM unnest(%(request_ids)s::text[], %(delivery_ids)s::bigint[]) AS x (request_id, delivery_id)
WHERE EXISTS (SELECT 1 FROM kirim_deliveries d WHERE d.id = x.delivery_id)
  AND NOT EXISTS (SELECT 1 FROM kirim_attempts a WHERE a.provider_request_id = x.request_id);

-- name: note_ledger_behind
-- Record what a worker found missing, for `kirim doctor` (kirim_meta, key ledger_behind:…).
INSERT INTO kirim_meta (key, value) VALUES (%(key)s, %(value)s)
ON CONFLICT (key) DO UPDATE SET value = excluded.value;
