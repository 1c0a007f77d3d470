-- Recipients' addresses (kirim.store.addresses), PostgreSQL. Named parameters
-- (%(name)s); a set of ids is an array. What an address may be is checked in Python
-- (kirim.addresses), before. Time: kirim_now(%(now)s), the time of record.

-- name: add_address
-- Add an address (or register a retired one again, with its new label).
INSERT INTO kirim_addresses AS a (recipient_id, channel, address, label, added_at)
VALUES (%(recipient_id)s, %(channel)s, %(address)s, %(label)s, kirim_now(%(now)s::float8))
ON CONFLICT (recipient_id, channel, address) DO UPDATE
SET label = excluded.label, retired_at = NULL, retired_reason = NULL,
    added_at = CASE WHEN a.retired_at IS NULL THEN a.added_at ELSE excluded.added_at END
RETURNING recipient_id, channel, address, label, added_at, retired_at, retired_reason;

-- name: addresses_of
-- The addresses not retired of these recipients, oldest first (the fan-out's).
SELECT recipient_id, channel, address, label, added_at, retired_at, retired_reason
FROM kirim_addresses
WHERE recipient_id = ANY(%(ids)s::text[]) AND retired_at IS NULL
ORDER BY recipient_id, channel, added_at, id;

-- name: list_addresses
-- Every address of one recipient, retired ones too, oldest first.
SELECT recipient_id, channel, address, label, added_at, retired_at, retired_reason
FROM kirim_addresses WHERE recipient_id = %(recipient_id)s
ORDER BY channel, added_at, id;

-- name: retire_address
-- Mark an address of a channel dead for every recipient that has it.
UPDATE kirim_addresses SET retired_at = kirim_now(%(now)s::float8), retired_reason = %(reason)s
WHERE channel = %(channel)s AND address = %(address)s AND retired_at IS NULL;

-- name: remove_address
-- Forget one address of one recipient.
DELETE FROM kirim_addresses
WHERE recipient_id = %(recipient_id)s AND channel = %(channel)s AND address = %(address)s;

-- name: retired_addresses
-- How many addresses are retired, per channel.
SELECT channel, count(*) AS n FROM kirim_addresses WHERE retired_at IS NOT NULL
GROUP BY channel ORDER BY channel;
