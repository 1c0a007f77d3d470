-- The dashboard's chart: what happened per time bucket (Operator.activity).

-- name: activity
-- Deliveries per bucket of [since, until) and kind, each counted once, by its current
-- status, at the time it reached it: sent, confirmed and delivered at sent_at (those
-- sent under assumed_sent as in_doubt), failed (bounced too) and in_doubt at updated_at.
-- Scans the deliveries, as the overview's counts do.
SELECT floor((at - %(since)s::float8) / %(bucket)s::float8)::bigint AS i, kind, count(*) AS n
FROM (
    SELECT sent_at AS at,
           CASE WHEN doubt = 'assumed_sent' THEN 'in_doubt' ELSE 'sent' END AS kind
    FROM kirim_deliveries
    WHERE status IN ('sent', 'confirmed', 'delivered')
      AND sent_at >= %(since)s::float8 AND sent_at < %(until)s::float8
    UNION ALL
    SELECT updated_at AS at, CASE WHEN status = 'bounced' THEN 'failed' ELSE status END AS kind
    FROM kirim_deliveries
    WHERE status IN ('failed', 'bounced', 'in_doubt')
      AND updated_at >= %(since)s::float8 AND updated_at < %(until)s::float8
) AS happened
GROUP BY i, kind
ORDER BY i, kind;

-- name: figures
-- The overview's figures (kirim.http.figures): deliveries per channel, status, doubt
-- and the status of each one's latest job (NULL: none), in one scan of the deliveries.
SELECT d.channel, d.status, d.doubt, j.status AS job_status, COUNT(*) AS n
FROM kirim_deliveries d
LEFT JOIN kirim_jobs j
    ON j.id = (SELECT MAX(k.id) FROM kirim_jobs k WHERE k.delivery_id = d.id)
GROUP BY d.channel, d.status, d.doubt, j.status
ORDER BY d.channel, d.status;
