-- kirim schema version 11 (PostgreSQL): the feed's change order, for live updates
-- (kirim.live).
--
-- upgrade: safe: two columns and triggers that older workers never read; the triggers
--   number their feed writes as they number the newer kirim's
--
-- Every write to a feed row (a new message, a mark set or cleared, a delete) gives the
-- row the next number of one sequence, in the write's own transaction: changed_seq, and
-- created_seq when the row is new. A stream's event id is that number, so a browser that
-- reconnects with Last-Event-ID N is sent the rows whose changed_seq is past N, each as
-- it is now: nothing missed, nothing repeated. For that, one recipient's numbers must
-- follow its commits: the trigger takes a lock on the recipient
-- (pg_advisory_xact_lock, held to the commit) before it draws the number, so a
-- transaction that drew 11 commits after the one that drew 10. (The feed's own
-- statements say pg_notify('kirim_feed', recipient_id) for the streams' wake-ups.)
ALTER TABLE kirim_feed ADD COLUMN created_seq bigint, ADD COLUMN changed_seq bigint;
CREATE SEQUENCE kirim_feed_change_seq;
UPDATE kirim_feed SET created_seq = id, changed_seq = id;
SELECT setval('kirim_feed_change_seq', coalesce(max(id), 0) + 1, false) FROM kirim_feed;
CREATE INDEX kirim_feed_changes ON kirim_feed (recipient_id, changed_seq);
CREATE FUNCTION kirim_feed_number() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('kirim_feed:' || NEW.recipient_id, 0));
    NEW.changed_seq := nextval('kirim_feed_change_seq');
    IF TG_OP = 'INSERT' THEN
        NEW.created_seq := NEW.changed_seq;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER kirim_feed_new BEFORE INSERT ON kirim_feed
FOR EACH ROW EXECUTE FUNCTION kirim_feed_number();
CREATE TRIGGER kirim_feed_changed BEFORE UPDATE OF seen_at, read_at, archived_at, deleted_at
ON kirim_feed FOR EACH ROW
WHEN (OLD.seen_at IS DISTINCT FROM NEW.seen_at OR OLD.read_at IS DISTINCT FROM NEW.read_at
      OR OLD.archived_at IS DISTINCT FROM NEW.archived_at
      OR OLD.deleted_at IS DISTINCT FROM NEW.deleted_at)
EXECUTE FUNCTION kirim_feed_number();
