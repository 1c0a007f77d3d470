"""Recipients' preferences in the ledger, written once for both backends.

Each function is an ``Operation`` (``kirim.store.sequence``) that a backend runs in
one transaction of its own (``Recipients``), or that another operation runs inside
its own (``transitions.claim`` reads the preferences of what it claims, under the
claim's locks). The document stored is ``Preferences.to_json()``; what it may hold
is checked by ``kirim.preferences`` before it is written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from kirim.keys import text_problem
from kirim.preferences import Preferences
from kirim.store.rows import Row
from kirim.store.sequence import TIME, Operation, Query


def preferences_from(row: Row) -> Preferences:
    """A row of ``kirim_preferences`` (``document`` is JSON text on both backends)."""
    document = row["document"]
    value = json.loads(document) if isinstance(document, str) else document
    return Preferences.from_json(row["recipient_id"], value, updated_at=float(row["updated_at"]))


def preferences_of(recipient_ids: Iterable[str]) -> Operation[dict[str, Preferences]]:
    """The preferences of those of ``recipient_ids`` that have any, by id."""
    ids = sorted(r for r in set(recipient_ids) if text_problem(r) is None)
    if not ids:  # a text no column can hold (a NUL) is nobody's id
        return {}
    rows = yield Query("preferences_of", {"ids": ids})
    return {r["recipient_id"]: preferences_from(r) for r in rows}


def set_preferences(prefs: Preferences, given: float) -> Operation[Preferences]:
    """Replace the recipient's document; the result carries the store's ``updated_at``."""
    at = yield TIME
    args = {
        "recipient_id": prefs.recipient_id,
        "document": json.dumps(prefs.to_json(), sort_keys=True),
        "now": at(given),
    }
    rows = yield Query("set_preferences", args)
    return preferences_from(rows[0])


def delete_preferences(recipient_id: str) -> Operation[bool]:
    """Forget the recipient's preferences; False when there were none."""
    if text_problem(recipient_id) is not None:
        return False
    count = yield Query("delete_preferences", {"recipient_id": recipient_id}, count=True)
    return bool(count)
