-- Recipients' addresses (kirim.store.addresses), SQLite. Named parameters (:name); a
-- set of ids is one JSON array (json_each). What an address may be is checked in
-- Python (kirim.addresses), before.

-- name: add_address
-- Add an address (or register a retired one again, with its new label).
INSERT INTO kirim_addresses (recipient_id, channel, address, label, added_at)
VALUES (:recipient_id, :channel, :address, :label, :now)
ON CONFLICT (recipient_id, channel, address) DO UPDATE
SET label = excluded.label, retired_at = NULL, retired_reason = NULL,
    added_at = CASE WHEN kirim_addresses.retired_at IS NULL THEN kirim_addresses.added_at
                    ELSE excluded.added_at END
RETURNING recipient_id, channel, address, label, added_at, retired_at, retired_reason;

-- name: addresses_of
-- The addresses not retired of these recipients, oldest first (the fan-out's).
SELECT recipient_id, channel, address, label, added_at, retired_at, retired_reason
FROM kirim_addresses
WHERE recipient_id IN (SELECT value FROM json_each(:ids)) AND retired_at IS NULL
ORDER BY recipient_id, channel, added_at, id;

-- name: list_addresses
-- Every address of one recipient, retired ones too, oldest first.
SELECT recipient_id, channel, address, label, added_at, retired_at, retired_reason
FROM kirim_addresses WHERE recipient_id = :recipient_id
ORDER BY channel, added_at, id;

-- name: retire_address
-- Mark an address of a channel dead for every recipient that has it.
UPDATE kirim_addresses SET retired_at = :now, retired_reason = :reason
WHERE channel = :channel AND address = :address AND retired_at IS NULL;

-- name: remove_address
-- Forget one address of one recipient.
DELETE FROM kirim_addresses
WHERE recipient_id = :recipient_id AND channel = :channel AND address = :address;

-- name: retired_addresses
-- How many addresses are retired, per channel.
SELECT channel, count(*) AS n FROM kirim_addresses WHERE retired_at IS NOT NULL
GROUP BY channel ORDER BY channel;
