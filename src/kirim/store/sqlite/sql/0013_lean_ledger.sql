-- kirim schema version 13 (SQLite): a lean ledger. Same tables and names as PostgreSQL.
--
-- upgrade: stop: the callbacks now find a delivery by its provider message id in a
--   side table that only the newer kirim writes: a message id an older worker records
--   after this migration would not be found by a callback
--
-- What the hot path (claim, intent, finish) changes is named by no index, so that a
-- transition rewrites the row and no index entry (PostgreSQL's reason is its HOT
-- updates; SQLite's, the B-tree pages each index entry moved writes to the journal).
-- The features read through indexes on columns written once:
--
-- - the deliveries by status (status, id), the finished ones (updated_at, id) and the
--   suppressed ones (reason, updated_at) lose their indexes: every transition changes
--   status and updated_at. Prune walks the finished deliveries in id order (the
--   primary key); the dashboard's pages already do; kirim doctor counts the in-doubt
--   ones in one scan, as the overview's counts do.
-- - a callback finds its delivery by message id through kirim_message_ids, one row per
--   (delivery, message id) the delivery or one of its attempts ever recorded, inserted
--   once and never updated (the finish writes it in its own commit): no index on the
--   provider_message_id columns, which a finish sets.
--
-- (SQLite keeps the attempts' foreign keys: it cannot drop one without rebuilding the
-- table, a long write on a populated database.)
CREATE TABLE kirim_message_ids (
    delivery_id INTEGER NOT NULL,
    message_id  TEXT    NOT NULL,
    PRIMARY KEY (delivery_id, message_id)
) WITHOUT ROWID;
INSERT INTO kirim_message_ids (delivery_id, message_id)
SELECT id, provider_message_id FROM kirim_deliveries WHERE provider_message_id IS NOT NULL
UNION
SELECT delivery_id, provider_message_id FROM kirim_attempts
WHERE provider_message_id IS NOT NULL;
CREATE INDEX kirim_message_ids_message ON kirim_message_ids (message_id);

DROP INDEX kirim_deliveries_status;
DROP INDEX kirim_deliveries_finished;
DROP INDEX kirim_deliveries_suppressed;
DROP INDEX kirim_deliveries_message;
DROP INDEX kirim_attempts_message;
