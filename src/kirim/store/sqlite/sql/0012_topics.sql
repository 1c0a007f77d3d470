-- kirim schema version 12 (SQLite): topics, their subscribers and fan-outs (kirim.topics).
--
-- upgrade: safe: three tables older workers never read; record topic events only once
--   every worker runs the newer kirim (an older one never expands them)
--
-- A topic keeps one change number (kirim_topics.seq). Each subscribe, unsubscribe and
-- topic event of the topic takes the next one, in its own transaction, under the
-- topic's row lock: the numbers follow the commits. A subscription is live from its
-- added_seq until its removed_seq (kept, not deleted: a fan-out still running reads
-- the subscribers as of its own number, its mark). A topic event is expanded in
-- batches of subscribers in recipient order; its cursor (the last recipient done) is
-- committed with each batch's deliveries, under a lease fenced by a token.
CREATE TABLE kirim_topics (
    topic      TEXT PRIMARY KEY,
    seq        INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE kirim_topic_subscriptions (
    id           INTEGER PRIMARY KEY,
    topic        TEXT NOT NULL,
    recipient_id TEXT NOT NULL,
    added_seq    INTEGER NOT NULL,
    removed_seq  INTEGER,
    added_at     REAL NOT NULL,
    removed_at   REAL
);
CREATE UNIQUE INDEX kirim_topic_subscriptions_live
    ON kirim_topic_subscriptions (topic, recipient_id) WHERE removed_seq IS NULL;
CREATE INDEX kirim_topic_subscriptions_order
    ON kirim_topic_subscriptions (topic, recipient_id, added_seq);
CREATE TABLE kirim_topic_events (
    id               INTEGER PRIMARY KEY,
    topic            TEXT NOT NULL,
    type             TEXT NOT NULL,
    event_id         TEXT NOT NULL,
    data             TEXT NOT NULL,
    mark             INTEGER NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('expanding', 'done')),
    cursor           TEXT,
    batches          INTEGER NOT NULL DEFAULT 0,
    recipients       INTEGER NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_token      TEXT,
    lease_expires_at REAL,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    finished_at      REAL
);
CREATE UNIQUE INDEX kirim_topic_events_once ON kirim_topic_events (type, event_id, topic);
CREATE INDEX kirim_topic_events_expanding ON kirim_topic_events (id)
    WHERE status = 'expanding';
CREATE INDEX kirim_topic_events_by_topic ON kirim_topic_events (topic, id);
