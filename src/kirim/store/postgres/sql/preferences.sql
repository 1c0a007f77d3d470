-- Recipients' preferences (kirim.store.recipients), PostgreSQL. Named parameters
-- (%(name)s); a set of ids is an array. The document is
-- kirim.preferences.Preferences.to_json(); its rules are checked in Python, before.
-- Time: kirim_now(%(now)s), the time of record.

-- name: preferences_of
-- The preferences of these recipients (those that have any).
SELECT recipient_id, document, updated_at FROM kirim_preferences
WHERE recipient_id = ANY(%(ids)s::text[])
ORDER BY recipient_id;

-- name: set_preferences
-- Replace one recipient's document (or make it).
INSERT INTO kirim_preferences (recipient_id, document, updated_at)
VALUES (%(recipient_id)s, %(document)s, kirim_now(%(now)s::float8))
ON CONFLICT (recipient_id) DO UPDATE
SET document = excluded.document, updated_at = excluded.updated_at
RETURNING recipient_id, document, updated_at;

-- name: delete_preferences
-- Forget one recipient's preferences.
DELETE FROM kirim_preferences WHERE recipient_id = %(recipient_id)s;
