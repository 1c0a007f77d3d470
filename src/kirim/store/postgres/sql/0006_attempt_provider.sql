-- kirim schema version 6 (PostgreSQL): every attempt records the provider it went to.
--
-- provider: the name of the configured channel whose provider the request was sent
-- to: the delivery's own channel, or one of its `fallback` channels (failover, see
-- docs/channels.md "How failover decides"). The worker routes each attempt from these
-- rows, not from its memory, so the rule holds across workers and crashes. Rows
-- written before this version have none: they went to the delivery's own channel.
ALTER TABLE kirim_attempts ADD COLUMN provider TEXT;
