-- kirim schema version 5 (SQLite): delivery callbacks (POST /v1/callbacks/{channel}).
--
-- A delivery may now be `delivered` or `bounced`, as a provider's callback says, and a
-- pruned one leaves a tombstone with that status. SQLite cannot alter a CHECK
-- constraint, so the two lists of statuses are widened in the schema's text (the way
-- SQLite's ALTER TABLE documentation gives for a change that leaves every stored row
-- valid): the migration runner then bumps the schema version, so that every open
-- connection reads the new text.
--
-- upgrade: safe: it widens two status checks and adds the callbacks' tables; older
--   workers never write delivered or bounced, but an older kirim fails on a delivery a
--   callback marked so: take callbacks only once every process runs the newer kirim
PRAGMA writable_schema = ON;
UPDATE sqlite_master
SET sql = replace(sql, '''canceled'', ''in_doubt'')',
                  '''canceled'', ''in_doubt'', ''delivered'', ''bounced'')')
WHERE type = 'table' AND name = 'kirim_deliveries';
UPDATE sqlite_master
SET sql = replace(sql, '''sent'', ''failed'', ''canceled'')',
                  '''sent'', ''failed'', ''canceled'', ''delivered'', ''bounced'')')
WHERE type = 'table' AND name = 'kirim_key_tombstones';
PRAGMA writable_schema = OFF;

-- Prune finds the finished deliveries by this index: delivered and bounced are finished.
DROP INDEX kirim_deliveries_finished;
CREATE INDEX kirim_deliveries_finished ON kirim_deliveries (updated_at, id)
    WHERE status IN ('sent', 'failed', 'canceled', 'delivered', 'bounced');

-- A callback names the provider's message id: find its delivery by index, through the
-- delivery (the first message id it got) or any of its attempts (a second request's).
CREATE INDEX kirim_deliveries_message ON kirim_deliveries (channel, provider_message_id)
    WHERE provider_message_id IS NOT NULL;
CREATE INDEX kirim_attempts_message ON kirim_attempts (provider_message_id)
    WHERE provider_message_id IS NOT NULL;

-- Every provider message id a callback confirmed for a delivery, with the provider's
-- latest word on it. One row per (delivery, message id): a resent callback changes
-- nothing; a second message id for one delivery is a measured duplicate.
CREATE TABLE kirim_confirmations (
    id          INTEGER PRIMARY KEY,
    delivery_id INTEGER NOT NULL REFERENCES kirim_deliveries (id),
    message_id  TEXT    NOT NULL,
    status      TEXT    NOT NULL CHECK (status IN ('delivered', 'bounced', 'failed')),
    reason      TEXT,
    reported_at REAL,
    received_at REAL    NOT NULL,
    updated_at  REAL    NOT NULL
);

CREATE UNIQUE INDEX kirim_confirmations_delivery ON kirim_confirmations (delivery_id, message_id);
CREATE INDEX kirim_confirmations_message ON kirim_confirmations (message_id);
