-- kirim schema version 8 (SQLite): records that claim no more than kirim knows.
--
-- upgrade: safe: it adds a column older workers leave empty (their tombstones keep no
--   doubt, as before) and a table they never read (their callbacks for unrecorded
--   messages are answered unknown and dropped, as before)
--
-- kirim_key_tombstones.doubt: the doubt a pruned delivery had (assumed_sent, held,
-- resolved), so that asking for its key again answers "sent (assumed)" and not a plain
-- "sent" for as long as the tombstone lasts. Tombstones written before this version
-- have none.
ALTER TABLE kirim_key_tombstones ADD COLUMN doubt TEXT;

-- kirim_callback_inbox: a provider's delivery callback for a message no delivery has
-- recorded yet (an instant bounce or SMS report can overtake the provider's own answer
-- to the request). It is kept, and applied once the message id (or the key it carries)
-- finds its delivery; the worker's reaper tries, every round. Kept for a day at most.
CREATE TABLE kirim_callback_inbox (
    id          INTEGER PRIMARY KEY,
    channel     TEXT NOT NULL,
    message_id  TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('delivered', 'bounced', 'failed')),
    key         TEXT,
    reason      TEXT,
    reported_at REAL,
    received_at REAL NOT NULL
);
CREATE UNIQUE INDEX kirim_callback_inbox_message
    ON kirim_callback_inbox (channel, message_id, status);
CREATE INDEX kirim_callback_inbox_received ON kirim_callback_inbox (received_at);
