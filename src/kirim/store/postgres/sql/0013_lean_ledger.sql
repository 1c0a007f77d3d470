-- kirim schema version 13 (PostgreSQL): a lean ledger. Same tables and names as SQLite.
--
-- upgrade: stop: the callbacks now find a delivery by its provider message id in a
--   side table that only the newer kirim writes: a message id an older worker records
--   after this migration would not be found by a callback
--
-- What the hot path (claim, intent, finish) changes is named by no index, so that
-- PostgreSQL can update a delivery or an attempt in place on its page (a HOT update:
-- no new index entries, a fraction of the WAL). The features read through indexes on
-- columns written once:
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
-- - the attempts lose their foreign key to the deliveries: an attempt is only ever
--   inserted by the intent's statement, which joins (and locks) its delivery, and
--   retention deletes attempts before their delivery; the key's check cost every intent
--   a lookup and a lock of the delivery's key.
-- - the deliveries keep room on each page for the versions a claim and a finish write
--   (fillfactor 45), the attempts for their one finish (fillfactor 50). This applies to
--   pages written from now on; the table is not rewritten.
--
-- On a populated database: the side table is filled by one INSERT ... SELECT, which
-- takes no lock that blocks another transaction's reads or writes of the ledger; only
-- the last statements (DROP INDEX, DROP CONSTRAINT, SET fillfactor) take the tables'
-- exclusive locks, and they are catalog changes: held from there to the commit, a few
-- milliseconds (docs/upgrading.md has the figures of a million deliveries).
CREATE TABLE kirim_message_ids (
    delivery_id bigint NOT NULL,
    message_id  text   NOT NULL,
    PRIMARY KEY (delivery_id, message_id)
) WITH (fillfactor = 100);
INSERT INTO kirim_message_ids (delivery_id, message_id)
SELECT id, provider_message_id FROM kirim_deliveries WHERE provider_message_id IS NOT NULL
UNION
SELECT delivery_id, provider_message_id FROM kirim_attempts
WHERE provider_message_id IS NOT NULL;
CREATE INDEX kirim_message_ids_message ON kirim_message_ids (message_id);

DROP INDEX kirim_deliveries_status, kirim_deliveries_finished, kirim_deliveries_suppressed,
    kirim_deliveries_message, kirim_attempts_message;
ALTER TABLE kirim_attempts DROP CONSTRAINT kirim_attempts_delivery_id_fkey;
ALTER TABLE kirim_deliveries SET (fillfactor = 45);
ALTER TABLE kirim_attempts SET (fillfactor = 50);
