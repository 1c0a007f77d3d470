-- kirim schema version 7 (SQLite): the notification layer (docs/notifications.md).
--
-- A delivery made by notify_event() names its notification type and the recipient
-- whose preferences rule it; one that preferences or a throttle stopped is
-- `suppressed`, a final status, with the reason beside it. SQLite cannot alter a
-- CHECK constraint, so the status lists are widened in the schema's text, as in
-- version 5 (the migration runner then bumps the schema cookie).
--
-- upgrade: stop: older workers would deliver a notification type's deliveries without
--   reading the recipient's preferences again at claim, and fail on the status
--   suppressed
ALTER TABLE kirim_deliveries ADD COLUMN type TEXT;
ALTER TABLE kirim_deliveries ADD COLUMN recipient_id TEXT;
ALTER TABLE kirim_deliveries ADD COLUMN reason TEXT;
PRAGMA writable_schema = ON;
UPDATE sqlite_master
SET sql = replace(sql, '''delivered'', ''bounced'')',
                  '''delivered'', ''bounced'', ''suppressed'')')
WHERE type = 'table' AND name IN ('kirim_deliveries', 'kirim_key_tombstones');
PRAGMA writable_schema = OFF;

-- Prune finds the finished deliveries by this index: suppressed ones are finished.
DROP INDEX kirim_deliveries_finished;
CREATE INDEX kirim_deliveries_finished ON kirim_deliveries (updated_at, id)
    WHERE status IN ('sent', 'failed', 'canceled', 'delivered', 'bounced', 'suppressed');
CREATE INDEX kirim_deliveries_suppressed ON kirim_deliveries (reason, updated_at)
    WHERE status = 'suppressed';

-- One recipient's preferences (kirim.preferences.Preferences as JSON).
CREATE TABLE kirim_preferences (
    recipient_id TEXT PRIMARY KEY,
    document     TEXT NOT NULL,
    updated_at   REAL NOT NULL
);

-- Throttle counters: how many deliveries a scope (a recipient, a recipient and type,
-- or a key) was given in one fixed window. Taken with an upsert in the enqueue's
-- transaction, so the count is exact across processes and hosts. Prune deletes a
-- counter once its window has ended (kirim.store.retention), by kirim_throttle_ended.
CREATE TABLE kirim_throttle (
    scope        TEXT    NOT NULL,
    window_start REAL    NOT NULL,
    window_end   REAL    NOT NULL,
    count        INTEGER NOT NULL,
    PRIMARY KEY (scope, window_start)
);
CREATE INDEX kirim_throttle_ended ON kirim_throttle (window_end);

-- Digests: one per stream (type, digest key, channel) and window; its delivery's
-- idempotency key is derived from both, so concurrent first events make one. A digest
-- is sealed when its delivery is claimed; an event that comes later goes to the next.
-- pruned_at: its delivery was pruned (the row goes once its events' data has gone).
CREATE TABLE kirim_digests (
    key          TEXT PRIMARY KEY,
    stream       TEXT NOT NULL,
    window_start REAL NOT NULL,
    window_end   REAL NOT NULL,
    delivery_id  INTEGER,
    sealed_at    REAL,
    pruned_at    REAL,
    created_at   REAL NOT NULL
);
CREATE INDEX kirim_digests_stream ON kirim_digests (stream, window_start);
CREATE INDEX kirim_digests_pruned ON kirim_digests (pruned_at) WHERE pruned_at IS NOT NULL;

-- The events of digests: each event once per stream, whichever digest took it.
-- pruned_at: its digest was pruned; the row stays, its data emptied, as long as the
-- digest delivery's key tombstone (so a retried event makes no second digest).
CREATE TABLE kirim_digest_events (
    id         INTEGER PRIMARY KEY,
    stream     TEXT NOT NULL,
    event_id   TEXT NOT NULL,
    digest_key TEXT NOT NULL,
    data       TEXT NOT NULL,
    created_at REAL NOT NULL,
    pruned_at  REAL
);
CREATE UNIQUE INDEX kirim_digest_events_once ON kirim_digest_events (stream, event_id);
CREATE INDEX kirim_digest_events_digest ON kirim_digest_events (digest_key, id);
CREATE INDEX kirim_digest_events_pruned ON kirim_digest_events (pruned_at)
    WHERE pruned_at IS NOT NULL;

-- A channel's provider request rate (`rate` in kirim.toml): the time its next request
-- may leave, shared by every worker on this database. A worker takes a slot with one
-- update and waits until it.
CREATE TABLE kirim_rates (
    channel TEXT PRIMARY KEY,
    next_at REAL NOT NULL
);
