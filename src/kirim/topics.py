"""Topics: recipients subscribe to a topic, and an event to the topic fans out to its
subscribers as of the event's commit (docs/topics.md).

The records (``kirim.store.topics`` keeps them, schema version 12):

- a **topic** keeps one change number: each subscribe, unsubscribe and topic event
  takes the next one in its own transaction, under the topic's row lock, so the
  numbers follow the commits;
- a **subscription** is live from its ``added_seq`` until its ``removed_seq``; an
  unsubscribe keeps the row (a fan-out still running reads the subscribers as of its
  own number);
- a **topic event** records its type, event id and data with its ``mark``: the number
  it took. Its fan-out sends to the subscriptions live at the mark, exactly those:
  one who subscribes after the event's commit gets nothing of it, one who unsubscribes
  after it still gets it. The worker expands it in batches of subscribers in recipient
  order (``kirim.worker.topics``); each batch's deliveries are recorded through the
  intake of ``notify_event`` (preferences, addresses, throttles, digests) in one
  transaction with the event's cursor, fenced by the expander's lease token.

A topic event's status moves along ``EDGES`` only: ``expanding`` (recorded) to
``done`` (its last batch committed).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kirim import limits
from kirim.validation import check_text
from kirim.views import iso

__all__ = [
    "EDGES",
    "Subscription",
    "TopicCounts",
    "TopicEvent",
    "TopicEventStatus",
    "TopicInfo",
    "check_topic",
    "progress",
]


class TopicEventStatus(enum.StrEnum):
    """Where a topic event's fan-out is."""

    EXPANDING = "expanding"
    DONE = "done"


#: (source, target) of every status change a topic event may take (None: recorded)
EDGES: frozenset[tuple[TopicEventStatus | None, TopicEventStatus]] = frozenset(
    {
        (None, TopicEventStatus.EXPANDING),
        (TopicEventStatus.EXPANDING, TopicEventStatus.EXPANDING),
        (TopicEventStatus.EXPANDING, TopicEventStatus.DONE),
    }
)


def is_edge(source: TopicEventStatus | None, target: TopicEventStatus) -> bool:
    """Whether a topic event may go from ``source`` to ``target``."""
    return (source, target) in EDGES


def progress(event: TopicEvent) -> str:
    """Where the event's fan-out is, as an operator reads it: ``pending`` (expanding, no
    batch committed yet), ``expanding`` (a batch or more, more to come) or ``done``."""
    if event.status is TopicEventStatus.DONE:
        return "done"
    return "expanding" if event.batches else "pending"


def check_topic(topic: object) -> str:
    """``topic`` if it is a topic's name kirim can store (non-blank text of one line, at
    most ``kirim.limits.TOPIC`` bytes), else ``BadValue``."""
    return check_text("topic", topic, limit=limits.TOPIC)


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscription:
    """One recipient on one topic, live from ``added_seq`` until ``removed_seq``."""

    topic: str
    recipient_id: str
    added_seq: int
    added_at: float
    removed_seq: int | None = None
    removed_at: float | None = None
    #: this call made it (False: the recipient was subscribed already)
    created: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "recipient_id": self.recipient_id,
            "added_seq": self.added_seq,
            "added_at": iso(self.added_at),
            "removed_seq": self.removed_seq,
            "removed_at": iso(self.removed_at),
            "created": self.created,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicEvent:
    """One event to a topic and its fan-out's progress."""

    id: int
    topic: str
    type: str
    event_id: str
    data_json: str
    #: the topic's change number at the event's commit: it goes to the subscriptions
    #: live at that number
    mark: int
    status: TopicEventStatus
    #: the last recipient whose deliveries are recorded (None: none yet)
    cursor: str | None
    batches: int
    #: subscribers fanned out to so far
    recipients: int
    created_at: float
    updated_at: float
    finished_at: float | None = None
    lease_owner: str | None = None
    lease_token: str | None = None
    lease_expires_at: float | None = None
    #: when an event that cancels this type's runs (its ``cancel_on``, with the same
    #: ``cancel_key`` value) reached the fan-out still under way, and why: the runs of
    #: its later batches start canceled (None: no such event)
    canceled_at: float | None = None
    cancel_why: str | None = None
    #: this call recorded it (False: the same type, event id and topic were given before)
    created: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "topic": self.topic,
            "type": self.type,
            "event_id": self.event_id,
            "mark": self.mark,
            "status": str(self.status),
            "cursor": self.cursor,
            "batches": self.batches,
            "recipients": self.recipients,
            "created_at": iso(self.created_at),
            "finished_at": iso(self.finished_at),
            "canceled_at": iso(self.canceled_at),
            "cancel_why": self.cancel_why,
            "created": self.created,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicInfo:
    """A topic as an operator sees it: its subscribers now and its recent fan-outs."""

    topic: str
    seq: int
    subscribers: int
    created_at: float
    recent: tuple[TopicEvent, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "seq": self.seq,
            "subscribers": self.subscribers,
            "created_at": iso(self.created_at),
            "recent": [e.to_json() for e in self.recent],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicCounts:
    """The topics of the ledger at a glance (``kirim status topics``, the dashboard's
    topics page): how many topics and live subscriptions, and where the topic events'
    fan-outs are. An event still ``expanding`` is *pending* until its first batch
    commits (no subscriber fanned out to yet), then *expanding*."""

    topics: int
    subscriptions: int
    pending: int
    expanding: int
    done: int

    def to_json(self) -> dict[str, object]:
        return {
            "topics": self.topics,
            "subscriptions": self.subscriptions,
            "events": {"pending": self.pending, "expanding": self.expanding, "done": self.done},
        }
