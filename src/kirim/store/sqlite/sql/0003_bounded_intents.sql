-- kirim schema version 3 (SQLite): every attempt intent is bounded in time.
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
ALTER TABLE kirim_attempts ADD COLUMN send_deadline REAL;
ALTER TABLE kirim_attempts ADD COLUMN settles_at REAL;
