-- kirim schema version 9 (SQLite): recipients' addresses (kirim.addresses).
--
-- upgrade: safe: a table older workers never read; their events go to the recipient id
--   as the channel's address, as before (add addresses once every process that sends
--   events runs the newer kirim)
--
-- One row per address a recipient has on a channel: an email, an E.164 phone, an APNs
-- or FCM device token, a Web Push subscription (its JSON), a Slack id. An event to the
-- recipient on that channel fans out to each address not retired (a delivery each). A
-- token the service calls dead is retired: kept, marked with when and why, never used
-- again (until the recipient's app registers it again).
CREATE TABLE kirim_addresses (
    id             INTEGER PRIMARY KEY,
    recipient_id   TEXT NOT NULL,
    channel        TEXT NOT NULL,
    address        TEXT NOT NULL,
    label          TEXT,
    added_at       REAL NOT NULL,
    retired_at     REAL,
    retired_reason TEXT
);
CREATE UNIQUE INDEX kirim_addresses_one ON kirim_addresses (recipient_id, channel, address);
CREATE INDEX kirim_addresses_by_address ON kirim_addresses (channel, address);
