"""The in-app inbox: a feed of messages per recipient, and what a recipient's app may
do to them.

A channel of the ``inbox`` provider (``kirim.providers.inbox``) delivers into the
feed: the message is a row of kirim's own database (``kirim_feed``), written in the
commit that marks its delivery sent, once per recipient and idempotency key. No
request leaves, so nothing is ever in doubt: a message is in the feed exactly once.

Each message has three marks, each ``None`` or the time it was set: ``seen_at`` (the
bell was opened), ``read_at`` (the message was opened or marked read; read implies
seen) and ``archived_at`` (out of the feed's default view). Setting a mark that is set
keeps its first time; ``unread`` and ``unarchive`` clear one. A deleted message is
gone from every view, but its row stays, emptied, so that its key stays taken (a
stalled worker's late commit of the same delivery cannot bring it back), until
retention removes it (``kirim.store.retention``).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


class FeedFilter(enum.StrEnum):
    """Which messages a page lists: the default (``INBOX``) is every one not archived."""

    INBOX = "inbox"
    UNSEEN = "unseen"
    UNREAD = "unread"
    ARCHIVED = "archived"
    ALL = "all"


class FeedAction(enum.StrEnum):
    """A change to one message (``POST .../feed/{item_id}/<action>``)."""

    SEEN = "seen"
    READ = "read"
    UNREAD = "unread"
    ARCHIVE = "archive"
    UNARCHIVE = "unarchive"


class FeedMark(enum.StrEnum):
    """A mark set on many messages at once (``POST .../feed/mark``)."""

    SEEN = "seen"
    READ = "read"
    ARCHIVED = "archived"


#: the most messages one page lists
MAX_PAGE = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedMessage:
    """What an inbox delivery writes into its recipient's feed (rendered, not yet a row)."""

    recipient_id: str
    idempotency_key: str
    delivery_id: int | None
    type: str | None
    title: str | None
    body: str | None
    action_url: str | None
    data: Any = None

    def row(self) -> dict[str, Any]:
        """The columns of its ``kirim_feed`` row (``data`` as JSON text)."""
        return {
            "recipient_id": self.recipient_id,
            "idempotency_key": self.idempotency_key,
            "delivery_id": self.delivery_id,
            "type": self.type,
            "title": self.title,
            "body": self.body,
            "action_url": self.action_url,
            "data": None if self.data is None else json.dumps(self.data, sort_keys=True),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedItem:
    """One message of a feed, as stored."""

    id: int
    recipient_id: str
    idempotency_key: str
    type: str | None
    title: str | None
    body: str | None
    action_url: str | None
    data: Any
    created_at: float
    seen_at: float | None
    read_at: float | None
    archived_at: float | None

    def to_json(self) -> dict[str, Any]:
        """The API's ITEM: times as ISO 8601 UTC text (or null)."""
        return {
            "id": self.id,
            "type": self.type,
            "title": self.title,
            "body": self.body,
            "action_url": self.action_url,
            "data": self.data,
            "created_at": iso(self.created_at),
            "seen_at": iso(self.seen_at),
            "read_at": iso(self.read_at),
            "archived_at": iso(self.archived_at),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedCounts:
    """Messages not archived that are not seen, and not read."""

    unseen: int
    unread: int

    def to_json(self) -> dict[str, int]:
        return {"unseen": self.unseen, "unread": self.unread}


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedPage:
    """One page of a feed, newest first: ``next_before`` is the cursor of the next
    (older) page, None at the end."""

    items: list[FeedItem]
    next_before: int | None
    counts: FeedCounts

    def to_json(self) -> dict[str, Any]:
        return {
            "items": [i.to_json() for i in self.items],
            "next_before": self.next_before,
            "counts": self.counts.to_json(),
        }


#: a change of a feed, told to ``Kirim.on_feed_change``: a new message, a mark set or
#: cleared on some, a message deleted
FeedChange = str  # "new" | "state" | "delete"


def iso(t: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC text, as every API time (``kirim.views.iso``:
    ``2026-12-02T01:05:47.123Z``)."""
    if t is None:
        return None
    moment = datetime.fromtimestamp(round(t, 3), UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
