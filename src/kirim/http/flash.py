"""The dashboard's flash messages: a code (and, for a bulk action, counts) in the URL of
the redirect after a form, the words here: the text is never taken from the URL."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from kirim.http.verbs import VERBS

#: flash messages, by code: the text is never taken from the URL
MESSAGES = {
    **{v.done_code: ("ok", f"notification {{id}} {v.done_text}") for v in VERBS.values()},
    **{v.refused_code: ("error", f"notification {{id}} {v.refused_text}") for v in VERBS.values()},
    "not_settled": (
        "error",
        "notification {id}: an earlier request may still reach the provider; try again later",
    ),
    "missing": ("error", "no notification {id}"),
    "nothing_selected": ("error", "nothing selected: tick the rows to act on first"),
    "logged_out": ("ok", "logged out"),
}


def flash(
    msg: str | None, ident: str | None, request: Request | None = None
) -> dict[str, str] | None:
    if msg == "bulk" and request is not None:
        return bulk_flash(request.query_params)
    if msg not in MESSAGES:
        return None
    kind, text = MESSAGES[msg]
    safe = ident if ident is not None and ident.isdigit() else "?"
    return {"kind": kind, "text": text.format(id=safe)}


#: a bulk action's outcomes, in the order its message says them
BULK_OUTCOMES = (
    ("done", "done"),
    ("refused", "refused"),
    ("not_settled", "not settled yet (an earlier request may still land: try again later)"),
    ("missing", "not found"),
)


def bulk_flash(query: Any) -> dict[str, str] | None:
    """``retry: 2 done, 1 refused``: a bulk action's counts (digits only from the URL)."""
    verb = query.get("verb")
    if verb not in VERBS:
        return None
    counts = {k: query.get(k, "0") for k, _ in BULK_OUTCOMES}
    if not all(v.isascii() and v.isdigit() and len(v) <= 6 for v in counts.values()):
        return None
    parts = [
        f"{int(counts[k])} {words}" for k, words in BULK_OUTCOMES if k == "done" or int(counts[k])
    ]
    failed = any(int(counts[k]) for k, _ in BULK_OUTCOMES if k != "done")
    return {"kind": "error" if failed else "ok", "text": f"{verb}: {', '.join(parts)}"}
