"""The in-app inbox's feeds in the ledger (``kirim.inbox``), written once for both
backends.

Each function is an ``Operation`` (``kirim.store.sequence``) a backend runs in one
transaction of its own. A message enters a feed only in the finish that marks its
delivery sent (``transitions.finish``, with ``insert_rows``); here the recipient's
app reads its feed and sets or clears its marks. Every write also yields the optional
``notify_feed`` (PostgreSQL: ``pg_notify('kirim_feed', recipient_id)``, delivered at
the commit, so other processes learn of it; SQLite has none).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kirim.inbox import (
    FeedAction,
    FeedCounts,
    FeedFilter,
    FeedItem,
    FeedMark,
    FeedMessage,
    FeedPage,
)
from kirim.store.rows import Row
from kirim.store.sequence import TIME, Operation, Query

#: a cursor past every id (the first page)
_NO_CURSOR = 2**63 - 1


def item_from(row: Row) -> FeedItem:
    """A row of ``kirim_feed``."""
    data = row["data"]

    def t(name: str) -> float | None:
        value = row[name]
        return None if value is None else float(value)

    return FeedItem(
        id=int(row["id"]),
        recipient_id=row["recipient_id"],
        idempotency_key=row["idempotency_key"],
        type=row["type"],
        title=row["title"],
        body=row["body"],
        action_url=row["action_url"],
        data=None if data is None else json.loads(data),
        created_at=float(row["created_at"]),
        seen_at=t("seen_at"),
        read_at=t("read_at"),
        archived_at=t("archived_at"),
    )


def notify(recipient_ids: Sequence[str]) -> Query:
    """The step that tells other processes these feeds changed (PostgreSQL only)."""
    return Query("notify_feed", {"recipients": sorted(set(recipient_ids))}, optional=True)


def insert_rows(messages: Sequence[FeedMessage], now: float) -> tuple[Query, Query]:
    """The steps that write ``messages`` into their feeds, once per recipient and key
    (a message already there is left as it is), and tell of it: the first's result is
    the rows written now (``id``, ``recipient_id``, ``idempotency_key``)."""
    items = [{**m.row(), "created_at": now} for m in messages]
    return Query("insert_feed", {"items": items}), notify([m.recipient_id for m in messages])


def _filter_args(which: FeedFilter) -> dict[str, Any]:
    archived = {FeedFilter.ARCHIVED: "yes", FeedFilter.ALL: "any"}.get(which, "no")
    return {
        "archived": archived,
        "unseen": which is FeedFilter.UNSEEN,
        "unread": which is FeedFilter.UNREAD,
    }


def page(
    recipient_id: str, which: FeedFilter, limit: int, before: int | None
) -> Operation[FeedPage]:
    """Up to ``limit`` messages older than ``before`` (the cursor), newest first, with
    the feed's counts (in one transaction: one snapshot)."""
    args = {
        "recipient_id": recipient_id,
        "before": _NO_CURSOR if before is None else before,
        "limit": limit + 1,
        **_filter_args(which),
    }
    rows, counted = yield (
        Query("feed_page", args),
        Query("feed_counts", {"recipient_id": recipient_id}),
    )
    items = [item_from(r) for r in rows[:limit]]
    more = len(rows) > limit
    return FeedPage(
        items=items, next_before=items[-1].id if more else None, counts=_counts(counted)
    )


def counts(recipient_id: str) -> Operation[FeedCounts]:
    """The feed's counts of messages not archived: not seen, not read."""
    rows = yield Query("feed_counts", {"recipient_id": recipient_id})
    return _counts(rows)


def _counts(rows: Sequence[Row]) -> FeedCounts:
    row = rows[0] if rows else None
    if row is None:
        return FeedCounts(unseen=0, unread=0)
    return FeedCounts(unseen=int(row["unseen"] or 0), unread=int(row["unread"] or 0))


def marks_after(item: FeedItem, action: FeedAction, now: float) -> dict[str, float | None]:
    """The marks of ``item`` after ``action`` at ``now``: a mark set keeps its first
    time, read implies seen."""
    seen, read, archived = item.seen_at, item.read_at, item.archived_at
    if action is FeedAction.SEEN:
        seen = seen if seen is not None else now
    elif action is FeedAction.READ:
        read = read if read is not None else now
        seen = seen if seen is not None else now
    elif action is FeedAction.UNREAD:
        read = None
    elif action is FeedAction.ARCHIVE:
        archived = archived if archived is not None else now
    else:
        archived = None
    return {"seen_at": seen, "read_at": read, "archived_at": archived}


def act(
    recipient_id: str, item_id: int, action: FeedAction, given: float
) -> Operation[tuple[FeedItem, bool] | None]:
    """``action`` on one message of the recipient's: the message after it and whether
    anything changed; None when the recipient has no such message."""
    at = yield TIME
    rows = yield Query("lock_feed_item", {"id": item_id, "recipient_id": recipient_id})
    if not rows:
        return None
    item = item_from(rows[0])
    marks = marks_after(item, action, at(given))
    before = {"seen_at": item.seen_at, "read_at": item.read_at, "archived_at": item.archived_at}
    if marks == before:
        return item, False
    written, _ = yield (
        Query("write_feed_marks", {"id": item_id, **marks}),
        notify([recipient_id]),
    )
    return item_from(written[0]), True


def mark(
    recipient_id: str, ids: Sequence[int] | None, which: FeedMark, given: float
) -> Operation[int]:
    """Set ``which`` on the recipient's messages ``ids`` (None: every one of theirs)
    that lack it; the number changed."""
    at = yield TIME
    args = {
        "recipient_id": recipient_id,
        "every": ids is None,
        "ids": sorted(set(ids or ())),
        "now": at(given),
    }
    changed = yield Query(f"feed_mark_{which}", args, count=True)
    if changed:
        yield notify([recipient_id])
    return int(changed)


def delete(recipient_id: str, item_id: int, given: float) -> Operation[bool]:
    """Delete one message of the recipient's (its row stays, emptied, with
    ``deleted_at``: its key stays taken); False when they had none such."""
    at = yield TIME
    args = {"id": item_id, "recipient_id": recipient_id, "now": at(given)}
    count = yield Query("delete_feed_item", args, count=True)
    if count:
        yield notify([recipient_id])
    return bool(count)
