"""The dashboard's browse page, its query string: read and checked, never trusted.

``parse`` turns the query of ``/dashboard/browse`` into a ``RecordFilter``, a cursor
and a page size, or into messages that say what is wrong with which field (the page
shows them, with status 422); ``link`` writes a query back (the pager's links). Times
are UTC: a ``datetime-local`` value (``2026-07-21T10:00``), or ISO 8601 text with an
offset (``2026-07-21T10:00:00Z``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar
from urllib.parse import urlencode

from kirim.model import DeliveryStatus, Doubt, RecordFilter
from kirim.validation import MAX_EPOCH, MAX_ID, text_problem

#: the fields of the form, in the order of the URL
FIELDS = ("status", "channel", "doubt", "dead", "from", "until", "order", "limit")
MAX_LIMIT = 200
DEFAULT_LIMIT = 50
MAX_TEXT = 200
_YES = {"1", "on", "true", "yes"}
_NO = {"", "0", "off", "false", "no"}
E = TypeVar("E", DeliveryStatus, Doubt)


@dataclass(frozen=True, slots=True, kw_only=True)
class Browse:
    """What the page shows: the filter, where the page starts, its size; ``form``: the
    values to put back in the form (normalised when they were good, as given when
    not); ``errors``: one sentence per bad field."""

    where: RecordFilter = field(default_factory=RecordFilter)
    cursor: int | None = None
    limit: int = DEFAULT_LIMIT
    form: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def parse(params: Mapping[str, Sequence[str]]) -> Browse:
    """The page's query (each name with every value given) checked field by field."""
    errors: list[str] = []
    form: dict[str, str] = {}
    one: dict[str, str] = {}
    for name in (*FIELDS, "cursor"):
        values = list(params.get(name, ()))
        if len(values) > 1:
            errors.append(f"{name} is given {len(values)} times: give it once")
        value = values[-1] if values else ""
        if text_problem(value) is not None or len(value) > MAX_TEXT:
            errors.append(f"{name} must be text of at most {MAX_TEXT} characters")
            value = ""
        one[name] = value.strip()
        form[name] = one[name]

    status = _choice(one["status"], DeliveryStatus, "status", errors)
    doubt = _choice(one["doubt"], Doubt, "doubt", errors)
    channel = one["channel"] or None
    if channel is not None and not channel.isprintable():
        errors.append("channel must be printable text")
    dead = one["dead"].lower()
    if dead not in _YES | _NO:
        errors.append("dead must be 1 (only dead letters) or empty")
    form["dead"] = "1" if dead in _YES else ""
    since = _time(one["from"], "from", errors)
    until = _time(one["until"], "until", errors)
    if since is not None and until is not None and since >= until:
        errors.append("from must be before until")
    for name, t in (("from", since), ("until", until)):
        if t is not None:
            form[name] = shown_time(t)
    order = one["order"] or "newest"
    if order not in ("newest", "oldest"):
        errors.append("order must be newest or oldest")
    form["order"] = "oldest" if order == "oldest" else ""
    cursor = _number(one["cursor"], "cursor", 0, MAX_ID, errors)
    limit = _number(one["limit"], "limit", 1, MAX_LIMIT, errors)
    if errors:
        return Browse(form=form, errors=errors)
    where = RecordFilter(
        status=status,
        channel=channel,
        doubt=doubt,
        dead=dead in _YES,
        since=since,
        until=until,
        oldest_first=order == "oldest",
    )
    return Browse(
        where=where, cursor=cursor, limit=DEFAULT_LIMIT if limit is None else limit, form=form
    )


def _choice(value: str, kind: type[E], name: str, errors: list[str]) -> E | None:
    if not value:
        return None
    try:
        return kind(value)
    except ValueError:
        errors.append(f"{name} must be one of {', '.join(kind)} (or empty: any)")
        return None


def _number(value: str, name: str, low: int, high: int, errors: list[str]) -> int | None:
    if not value:
        return None
    digits = value.isascii() and value.isdigit() and len(value) <= 19
    if not digits or not low <= int(value) <= high:
        errors.append(f"{name} must be a whole number from {low} to {high}")
        return None
    return int(value)


def _time(value: str, name: str, errors: list[str]) -> float | None:
    """Epoch seconds of a UTC date and time (naive: UTC), or None (and a message)."""
    if not value:
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        errors.append(
            f"{name} must be a date and time in UTC, like 2026-07-21T10:00 or 2026-07-21T10:00:00Z"
        )
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    epoch = at.timestamp()
    if not 0 <= epoch <= MAX_EPOCH:
        errors.append(f"{name} must be between 1970 and 9999")
        return None
    return epoch


def shown_time(epoch: float) -> str:
    """A ``datetime-local`` value, in UTC: ``2026-07-21T10:00`` (seconds, milliseconds
    when there are any)."""
    at = datetime.fromtimestamp(epoch, UTC).replace(tzinfo=None)
    if at.microsecond:
        return at.isoformat(timespec="milliseconds")
    return at.strftime("%Y-%m-%dT%H:%M" if at.second == 0 else "%Y-%m-%dT%H:%M:%S")


def link(form: Mapping[str, str], cursor: int | None = None) -> str:
    """``/dashboard/browse`` with the form's non-empty fields (and a cursor)."""
    pairs = [(name, form[name]) for name in FIELDS if form.get(name)]
    if cursor is not None:
        pairs.append(("cursor", str(cursor)))
    return "/dashboard/browse" + ("?" + urlencode(pairs) if pairs else "")
