-- Operator reads: pages of deliveries with their jobs and attempts, in two statements
-- (the page, then the attempts of all its deliveries), never one query per delivery.

-- name: records_newest
-- A page of deliveries below an id, newest first,
-- each with its most recent job (filters: NULL for any; dead: only those whose most
-- recent job is dead), for kirim list, GET /v1/notifications and the dashboard.
SELECT d.*,
       j.id AS job_id, j.delivery_id AS job_delivery_id, j.status AS job_status,
       j.run_at AS job_run_at, j.attempts AS job_attempts, j.max_attempts AS job_max_attempts,
       j.lease_owner AS job_lease_owner, j.lease_token AS job_lease_token,
       j.lease_expires_at AS job_lease_expires_at, j.last_error AS job_last_error,
       j.created_at AS job_created_at, j.updated_at AS job_updated_at
FROM kirim_deliveries AS d
LEFT JOIN kirim_jobs AS j
  ON j.id = (SELECT max(id) FROM kirim_jobs WHERE delivery_id = d.id)
WHERE d.id < :cursor
  AND (:status IS NULL OR d.status = :status)
  AND (:channel IS NULL OR d.channel = :channel)
  AND (:doubt IS NULL OR d.doubt = :doubt)
  AND (:since IS NULL OR d.created_at >= :since)
  AND (:until IS NULL OR d.created_at < :until)
  AND (:dead = 0 OR j.status = 'dead')
ORDER BY d.id DESC LIMIT coalesce(:limit, -1);

-- name: records_oldest
-- A page of deliveries above an id, oldest first,
-- each with its most recent job (filters: NULL for any; dead: only those whose most
-- recent job is dead), for kirim list, GET /v1/notifications and the dashboard.
SELECT d.*,
       j.id AS job_id, j.delivery_id AS job_delivery_id, j.status AS job_status,
       j.run_at AS job_run_at, j.attempts AS job_attempts, j.max_attempts AS job_max_attempts,
       j.lease_owner AS job_lease_owner, j.lease_token AS job_lease_token,
       j.lease_expires_at AS job_lease_expires_at, j.last_error AS job_last_error,
       j.created_at AS job_created_at, j.updated_at AS job_updated_at
FROM kirim_deliveries AS d
LEFT JOIN kirim_jobs AS j
  ON j.id = (SELECT max(id) FROM kirim_jobs WHERE delivery_id = d.id)
WHERE d.id > :cursor
  AND (:status IS NULL OR d.status = :status)
  AND (:channel IS NULL OR d.channel = :channel)
  AND (:doubt IS NULL OR d.doubt = :doubt)
  AND (:since IS NULL OR d.created_at >= :since)
  AND (:until IS NULL OR d.created_at < :until)
  AND (:dead = 0 OR j.status = 'dead')
ORDER BY d.id LIMIT coalesce(:limit, -1);

-- name: attempts_of_many
-- Every attempt of the deliveries of a page, by delivery, oldest first.
SELECT * FROM kirim_attempts WHERE delivery_id IN (SELECT value FROM json_each(:ids)) ORDER BY delivery_id, id;
