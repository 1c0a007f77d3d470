-- kirim schema version 17 (PostgreSQL): the digest step of workflows
-- (kirim.store.run_digests, docs/workflows.md#a-digest-step).
--
-- upgrade: safe: two tables older workers never read, and a wider check on a run's step
--   outcomes; a type with a digest step is known only to the newer kirim (add one once
--   every worker runs it: an older one sets such a run aside, a step kind it cannot read)
--
-- A window of one stream (sha256 of the type, the recipient and the digest key's value)
-- opens with its first member's arrival (window_start) and ends window seconds later;
-- at most one window of a stream is open (sealed_at NULL) at a time. The first member
-- to resume after the end seals it: the holder (its oldest member not canceled) and its
-- members' events (event id and data, oldest first) are written once, here.
CREATE TABLE kirim_run_digests (
    stream        TEXT NOT NULL,
    window_start  double precision NOT NULL,
    window_end    double precision NOT NULL,
    holder_run_id bigint,
    sealed_at     double precision,
    events        TEXT,
    created_at    double precision NOT NULL,
    PRIMARY KEY (stream, window_start)
);
CREATE UNIQUE INDEX kirim_run_digests_open ON kirim_run_digests (stream)
    WHERE sealed_at IS NULL;

-- Each run that reached a digest step: the window it joined (once: run_id is the key).
CREATE TABLE kirim_run_digest_members (
    run_id       bigint PRIMARY KEY REFERENCES kirim_runs (id) ON DELETE CASCADE,
    stream       TEXT NOT NULL,
    window_start double precision NOT NULL,
    created_at   double precision NOT NULL
);
CREATE INDEX kirim_run_digest_members_window ON kirim_run_digest_members (stream, window_start);

-- A step may now be gathered (a digest's holder) or joined (gathered into another's).
ALTER TABLE kirim_run_steps DROP CONSTRAINT kirim_run_steps_outcome_check;
ALTER TABLE kirim_run_steps ADD CONSTRAINT kirim_run_steps_outcome_check CHECK (outcome IN
    ('sent', 'waited', 'then', 'else', 'skipped', 'gathered', 'joined'));
