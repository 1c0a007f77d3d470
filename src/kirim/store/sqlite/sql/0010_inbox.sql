-- kirim schema version 10 (SQLite): the in-app inbox, a feed per recipient (kirim.inbox).
--
-- upgrade: safe: a table older workers never read or write; a channel of the inbox
--   provider is known only to the newer kirim (add one once every worker runs it)
--
-- One row per message of an inbox channel, written in the commit that marks its
-- delivery sent: unique per recipient and idempotency key, so a message is in a feed
-- exactly once. The id increases: it orders the feed (newest first), it is the list's
-- cursor and the live updates' event id. seen_at, read_at, archived_at: NULL or when
-- the recipient's app said so (epoch seconds, as every time in the ledger). A deleted
-- message keeps its row, emptied, with deleted_at: its key stays taken, so a late
-- commit of the same delivery (a stalled worker's) cannot bring it back; retention
-- removes the row.
CREATE TABLE kirim_feed (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    recipient_id    TEXT NOT NULL,
    delivery_id     INTEGER,
    idempotency_key TEXT NOT NULL,
    type            TEXT,
    title           TEXT,
    body            TEXT,
    action_url      TEXT,
    data            TEXT,
    created_at      REAL NOT NULL,
    seen_at         REAL,
    read_at         REAL,
    archived_at     REAL,
    deleted_at      REAL
);
CREATE UNIQUE INDEX kirim_feed_once ON kirim_feed (recipient_id, idempotency_key);
CREATE INDEX kirim_feed_by_recipient ON kirim_feed (recipient_id, id);
