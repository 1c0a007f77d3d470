-- kirim schema version 3 (PostgreSQL): every attempt intent is bounded in time, and
-- leases, takeovers, reaping, due-ness and settled-ness use the database's clock.
--
-- send_deadline: no request of this attempt leaves after it (the worker checks a
-- local monotonic deadline that is earlier, right before the request).
-- settles_at: after it the attempt can no longer cause a request to land (the
-- deadline plus the request timeout). Lookup-not-found, an operator retry of a
-- doubtful delivery and cancel wait until every earlier attempt has settled.
-- Rows written before this version have neither: they count as settled.
--
-- upgrade: stop: older workers would go on writing attempts without a send deadline,
--   which newer ones count as settled at once, so an operator's retry or cancel could
--   overlap a request still in flight
ALTER TABLE kirim_attempts ADD COLUMN send_deadline double precision;
ALTER TABLE kirim_attempts ADD COLUMN settles_at double precision;

-- The time of record: the caller's time when one is given (tests, tools that pass an
-- explicit clock), else the database's own clock, so that workers on hosts whose
-- clocks disagree still agree on when a lease expires. The session setting
-- kirim.clock_offset (seconds) shifts the database clock, for tests only.
CREATE OR REPLACE FUNCTION kirim_now(given double precision) RETURNS double precision
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT COALESCE(
        given,
        extract(epoch FROM statement_timestamp())::double precision
        + COALESCE(NULLIF(current_setting('kirim.clock_offset', true), '')::double precision, 0)
    )
$$;
