-- kirim schema version 11 (SQLite): the feed's change order, for live updates (kirim.live).
--
-- upgrade: safe: two columns and triggers that older workers never read; the triggers
--   number their feed writes as they number the newer kirim's
--
-- Every write to a feed row (a new message, a mark set or cleared, a delete) gives the
-- row the next number of one counter (kirim_feed_seq), in the write's own transaction:
-- changed_seq, and created_seq when the row is new. A stream's event id is that number,
-- so a browser that reconnects with Last-Event-ID N is sent the rows whose changed_seq
-- is past N, each as it is now: nothing missed, nothing repeated. SQLite runs one
-- writer at a time, so the numbers follow the commits. The counter is never lowered:
-- retention's deletes cannot give a number out twice.
ALTER TABLE kirim_feed ADD COLUMN created_seq INTEGER;
ALTER TABLE kirim_feed ADD COLUMN changed_seq INTEGER;
CREATE TABLE kirim_feed_seq (n INTEGER NOT NULL);
INSERT INTO kirim_feed_seq (n) SELECT coalesce(max(id), 0) FROM kirim_feed;
UPDATE kirim_feed SET created_seq = id, changed_seq = id;
CREATE INDEX kirim_feed_changes ON kirim_feed (recipient_id, changed_seq);
CREATE TRIGGER kirim_feed_new AFTER INSERT ON kirim_feed BEGIN
    UPDATE kirim_feed_seq SET n = n + 1;
    UPDATE kirim_feed SET created_seq = (SELECT n FROM kirim_feed_seq),
                          changed_seq = (SELECT n FROM kirim_feed_seq)
    WHERE id = NEW.id;
END;
CREATE TRIGGER kirim_feed_changed AFTER UPDATE OF seen_at, read_at, archived_at, deleted_at
ON kirim_feed
WHEN OLD.seen_at IS NOT NEW.seen_at OR OLD.read_at IS NOT NEW.read_at
     OR OLD.archived_at IS NOT NEW.archived_at OR OLD.deleted_at IS NOT NEW.deleted_at
BEGIN
    UPDATE kirim_feed_seq SET n = n + 1;
    UPDATE kirim_feed SET changed_seq = (SELECT n FROM kirim_feed_seq) WHERE id = NEW.id;
END;
