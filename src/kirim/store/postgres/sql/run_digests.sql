-- The digest step of workflows (kirim.store.run_digests). Lock order: the runs, then
-- the window, then the deliveries. A window's row is locked FOR UPDATE.

-- name: run_digest_member
-- The window a run joined, with its end, seal, holder and events (none: not joined).
SELECT m.run_id, m.stream, m.window_start, w.window_end, w.sealed_at, w.holder_run_id,
       w.events
FROM kirim_run_digest_members m
JOIN kirim_run_digests w ON w.stream = m.stream AND w.window_start = m.window_start
WHERE m.run_id = %(run_id)s::bigint;

-- name: lock_open_run_digest
-- A stream's open window (at most one: kirim_run_digests_open), locked.
SELECT * FROM kirim_run_digests WHERE stream = %(stream)s AND sealed_at IS NULL FOR UPDATE;

-- name: open_run_digest
-- A new window of a stream from :start (no row: one is open already; an insert of
-- another transaction's is waited for).
INSERT INTO kirim_run_digests (stream, window_start, window_end, created_at)
VALUES (%(stream)s, %(start)s::float8, %(end)s::float8, %(now)s::float8)
ON CONFLICT DO NOTHING
RETURNING *;

-- name: join_run_digest
-- A run joins a window, once.
INSERT INTO kirim_run_digest_members (run_id, stream, window_start, created_at)
VALUES (%(run_id)s::bigint, %(stream)s, %(window_start)s::float8, %(now)s::float8)
ON CONFLICT (run_id) DO NOTHING;

-- name: lock_run_digest
-- A window, locked (the seal, a cancellation of a member).
SELECT * FROM kirim_run_digests
WHERE stream = %(stream)s AND window_start = %(window_start)s::float8
FOR UPDATE;

-- name: run_digest_members
-- A window's members, oldest first, with their runs' status, event and data.
SELECT m.run_id, r.status, r.event_id, r.data
FROM kirim_run_digest_members m JOIN kirim_runs r ON r.id = m.run_id
WHERE m.stream = %(stream)s AND m.window_start = %(window_start)s::float8
ORDER BY m.created_at, m.run_id;

-- name: seal_run_digest
-- Seal a window: its holder and its events, once.
UPDATE kirim_run_digests
SET sealed_at = %(now)s::float8, holder_run_id = %(holder)s::bigint, events = %(events)s
WHERE stream = %(stream)s AND window_start = %(window_start)s::float8 AND sealed_at IS NULL;
