-- kirim schema version 15 (PostgreSQL): retention of workflow runs, topic events and
-- ended subscriptions (kirim.store.retention_records, `kirim prune`).
--
-- upgrade: safe: two tables and indexes older workers never read; prune (kirim prune,
--   [retention]) only once every process that records events runs the newer kirim,
--   since an older one does not read these tombstones
--
-- A run that is over (done, or canceled with nothing left to come back for), none of
-- whose deliveries is kept any more, goes with its steps; its key stays here a while
-- (as long as a delivery's key tombstone, [retention] keys), so that the event given
-- again starts no second run. A topic event fully fanned out goes likewise; its
-- (type, event id, topic) stays here, so that the event given again is not fanned out
-- again to the subscribers of the day.
CREATE TABLE kirim_run_tombstones (
    key          TEXT PRIMARY KEY,
    run_id       bigint NOT NULL,
    type         TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    recipient_id TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('done', 'canceled')),
    cursor       INTEGER NOT NULL,
    why          TEXT,
    created_at   double precision NOT NULL,
    updated_at   double precision NOT NULL,
    pruned_at    double precision NOT NULL
);
CREATE INDEX kirim_run_tombstones_pruned ON kirim_run_tombstones (pruned_at);

CREATE TABLE kirim_topic_event_tombstones (
    type        TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    topic       TEXT NOT NULL,
    id          bigint NOT NULL,
    mark        bigint NOT NULL,
    batches     INTEGER NOT NULL,
    recipients  INTEGER NOT NULL,
    created_at  double precision NOT NULL,
    finished_at double precision,
    pruned_at   double precision NOT NULL,
    PRIMARY KEY (type, event_id, topic)
);
CREATE INDEX kirim_topic_event_tombstones_pruned ON kirim_topic_event_tombstones (pruned_at);

-- Prune finds the runs that are over, the topic events done and the subscriptions
-- ended before its cut-off by index; a delivery's run (is it over?) by its step.
CREATE INDEX kirim_runs_over ON kirim_runs (updated_at, id)
    WHERE next_at IS NULL AND status IN ('done', 'canceled');
CREATE INDEX kirim_run_steps_delivery ON kirim_run_steps (delivery_id)
    WHERE delivery_id IS NOT NULL;
CREATE INDEX kirim_topic_events_done ON kirim_topic_events (finished_at, id)
    WHERE status = 'done';
CREATE INDEX kirim_topic_subscriptions_ended ON kirim_topic_subscriptions (removed_at)
    WHERE removed_seq IS NOT NULL;
