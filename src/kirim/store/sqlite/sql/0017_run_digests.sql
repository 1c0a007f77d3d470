-- kirim schema version 17 (SQLite): the digest step of workflows (kirim.store.run_digests,
-- docs/workflows.md#a-digest-step).
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
    window_start  REAL NOT NULL,
    window_end    REAL NOT NULL,
    holder_run_id INTEGER,
    sealed_at     REAL,
    events        TEXT,
    created_at    REAL NOT NULL,
    PRIMARY KEY (stream, window_start)
);
CREATE UNIQUE INDEX kirim_run_digests_open ON kirim_run_digests (stream)
    WHERE sealed_at IS NULL;

-- Each run that reached a digest step: the window it joined (once: run_id is the key).
CREATE TABLE kirim_run_digest_members (
    run_id       INTEGER PRIMARY KEY REFERENCES kirim_runs (id) ON DELETE CASCADE,
    stream       TEXT NOT NULL,
    window_start REAL NOT NULL,
    created_at   REAL NOT NULL
);
CREATE INDEX kirim_run_digest_members_window ON kirim_run_digest_members (stream, window_start);

-- A step may now be gathered (a digest's holder) or joined (gathered into another's).
-- SQLite cannot alter a CHECK: the table is rebuilt, its index with it.
CREATE TABLE kirim_run_steps_new (
    run_id      INTEGER NOT NULL REFERENCES kirim_runs (id) ON DELETE CASCADE,
    idx         INTEGER NOT NULL,
    outcome     TEXT NOT NULL CHECK (outcome IN ('sent', 'waited', 'then', 'else', 'skipped',
                                                 'gathered', 'joined')),
    why         TEXT NOT NULL,
    delivery_id INTEGER,
    until_at    REAL,
    created_at  REAL NOT NULL,
    PRIMARY KEY (run_id, idx)
);
INSERT INTO kirim_run_steps_new (run_id, idx, outcome, why, delivery_id, until_at, created_at)
SELECT run_id, idx, outcome, why, delivery_id, until_at, created_at FROM kirim_run_steps;
DROP TABLE kirim_run_steps;
ALTER TABLE kirim_run_steps_new RENAME TO kirim_run_steps;
CREATE INDEX kirim_run_steps_delivery ON kirim_run_steps (delivery_id)
    WHERE delivery_id IS NOT NULL;
