-- `kirim doctor`'s checks of a kirim store (src/kirim/doctor.py), read-only.

-- name: doctor_has_meta
-- Whether the schema's version table exists.
SELECT count(*) FROM pg_class WHERE oid = to_regclass('kirim_meta');

-- name: doctor_schema_version
-- The schema's version.
SELECT value FROM kirim_meta WHERE key = 'schema_version';

-- name: doctor_stuck
-- Deliveries in processing whose claim expired more than a lease ago, with no live
-- lease holding them (and the status of their active job, if any).
SELECT d.id, (SELECT j.status FROM kirim_jobs j WHERE j.delivery_id = d.id
                AND j.status IN ('queued', 'running', 'retry_scheduled')
              ORDER BY j.id DESC LIMIT 1) AS job_status
FROM kirim_deliveries d
WHERE d.status = 'processing' AND COALESCE(d.claim_expires_at, d.updated_at) < %(before)s
  AND NOT EXISTS (SELECT 1 FROM kirim_jobs j WHERE j.delivery_id = d.id
                  AND j.status = 'running' AND j.lease_expires_at >= %(now)s)
ORDER BY d.id LIMIT 1000;

-- name: doctor_in_doubt
-- The first deliveries in doubt.
SELECT id FROM kirim_deliveries WHERE status = 'in_doubt' ORDER BY id LIMIT %(limit)s;

-- name: doctor_in_doubt_count
-- How many deliveries are in doubt.
SELECT count(*) FROM kirim_deliveries WHERE status = 'in_doubt';

-- name: doctor_dead_count
-- How many jobs are dead letters.
SELECT count(*) FROM kirim_jobs WHERE status = 'dead';

-- name: doctor_latencies
-- How long the latest completed requests took.
SELECT completed_at - requested_at FROM kirim_attempts WHERE completed_at IS NOT NULL
ORDER BY id DESC LIMIT %(limit)s;

-- name: doctor_clock
-- The database's clock, now (not the transaction's start).
SELECT extract(epoch from clock_timestamp());

-- name: doctor_client_port
-- The client port the server sees for this session (NULL over a Unix socket).
SELECT inet_client_port();

-- name: doctor_durability
-- What a commit waits for, and whether this server is a standby.
SELECT current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('synchronous_standby_names') AS standby_names,
       current_setting('fsync') AS fsync,
       pg_is_in_recovery() AS in_recovery;

-- name: doctor_standbys
-- The standbys streaming from this server (state and sync_state need pg_monitor).
SELECT application_name AS name, state, sync_state FROM pg_stat_replication
ORDER BY application_name;

-- name: doctor_timeline
-- The timeline of the last checkpoint: above 1, this server was promoted.
SELECT timeline_id FROM pg_control_checkpoint();

-- name: doctor_ledger_behind
-- What workers found missing from the ledger after a lost connection (kirim_meta).
SELECT key, value FROM kirim_meta WHERE starts_with(key, 'ledger_behind:') ORDER BY key;
