-- kirim schema version 16 (PostgreSQL): a cancellation that reaches a topic event's fan-out
-- still under way (kirim.store.event_writes.cancel_matching, docs/topics.md).
--
-- upgrade: safe: two columns older workers never read; a cancellation committed during
--   a fan-out cancels the runs of its later batches only once every process that
--   expands topic events or records cancelling events runs the newer kirim
--
-- An event that cancels a workflow type's runs (that type's cancel_on, with the same
-- cancel_key value) marks every topic event of that type and value still expanding,
-- in its own transaction: each later batch of its fan-out starts its runs canceled,
-- so nothing of it is sent after the cancellation. The first cancellation's reason is
-- kept.
ALTER TABLE kirim_topic_events ADD COLUMN canceled_at double precision;
ALTER TABLE kirim_topic_events ADD COLUMN cancel_why TEXT;
