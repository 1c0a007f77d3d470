"""The order of a feed's changes (schema version 11), read for live updates
(``kirim.live``), written once for both backends.

Every write to a feed row numbers it, in the write's own transaction (triggers of
``0011_feed_changes.sql``): ``changed_seq``, and ``created_seq`` when it is new. Here
a stream reads what changed after the number it last sent: each row as it is now,
told as a new message (created after that number), a state change, or a delete.
"""

from __future__ import annotations

from dataclasses import dataclass

from kirim.inbox import FeedCounts, FeedItem
from kirim.store.feed import _counts, item_from
from kirim.store.sequence import Operation, Query


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedChange:
    """One feed row that changed after a stream's number, as it is now."""

    #: its number: the event id
    seq: int
    #: ``message`` (new since that number), ``state`` or ``deleted``
    kind: str
    item_id: int
    #: the message as it is now (None when deleted)
    item: FeedItem | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedChanges:
    """What changed in one feed after a number, oldest change first."""

    changes: list[FeedChange]
    counts: FeedCounts
    #: the number of the last row read (a message left out included; ``after`` when
    #: none): where the next read starts
    last: int
    #: more changes follow the last of these (read again from its number)
    more: bool


def changes_after(recipient_id: str, after: int, limit: int) -> Operation[FeedChanges]:
    """Up to ``limit`` rows of the recipient's feed written after number ``after``, in
    the order of their last write, with the feed's counts. A message both created and
    deleted after ``after`` is left out: the stream never told of it."""
    args = {"recipient_id": recipient_id, "after": after, "limit": limit + 1}
    rows, counted = yield (
        Query("feed_changes", args),
        Query("feed_counts", {"recipient_id": recipient_id}),
    )
    out = []
    for row in rows[:limit]:
        seq, new = int(row["changed_seq"]), int(row["created_seq"]) > after
        if row["deleted_at"] is not None:
            if not new:
                out.append(FeedChange(seq=seq, kind="deleted", item_id=int(row["id"]), item=None))
            continue
        kind = "message" if new else "state"
        out.append(FeedChange(seq=seq, kind=kind, item_id=int(row["id"]), item=item_from(row)))
    last = int(rows[:limit][-1]["changed_seq"]) if rows else after
    return FeedChanges(changes=out, counts=_counts(counted), last=last, more=len(rows) > limit)


def head(recipient_id: str) -> Operation[int]:
    """The number of the recipient's last feed write (0: none): a new stream's start."""
    rows = yield Query("feed_head", {"recipient_id": recipient_id})
    return int(rows[0]["head"] or 0) if rows else 0


def last_number() -> Operation[int]:
    """The last number given to any feed write: SQLite's streams look at it once a
    second for the writes of other processes."""
    rows = yield Query("feed_last_number")
    return int(rows[0]["head"] or 0) if rows else 0
