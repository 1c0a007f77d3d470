"""Topics, their subscriptions and fan-outs in the ledger (``kirim.topics``), written once
for both backends.

Each function is an ``Operation`` (``kirim.store.sequence``) a backend runs in one
transaction of its own. A change of a topic (subscribe, unsubscribe, an event) first
takes the topic's next change number with an upsert that locks the topic's row
(``bump_topic``), then reads what it changes: so the changes of one topic are
serialized, their numbers follow their commits, and an event's ``mark`` splits the
subscriptions into those committed before it (numbers up to the mark) and after.

A batch of a fan-out (``expand_batch``) is one transaction: the event's cursor is moved
from the one the expander read to the batch's last recipient, fenced by its lease
token (a stale expander, or one whose batch another already did, writes nothing),
then the batch's rows are written in the same transaction
(``event_writes.batch``): a plain type's deliveries, keyed
``default_key(event_id, recipient, channel)``, or a workflow type's runs, keyed
``run_key(type, event_id, recipient_id)`` (UNIQUE), so a batch done again, or the same
event given again, adds nothing, and a crash leaves both the progress and the rows of a
batch, or neither. A fan-out a cancellation reached while under way (its ``canceled_at``,
``event_writes.cancel_matching``) starts the runs of its later batches canceled: the
batch reads the mark in the statement that fences its progress, under the event's row
lock, which the cancellation takes too before it reads the runs to cancel.

Lock order: the topic's row, then its subscriptions (a change); the topic event's row,
then the deliveries or the runs (a batch), in key order.
"""

from __future__ import annotations

from collections.abc import Sequence

from kirim.keys import new_token, text_problem
from kirim.store.event_writes import TopicBatch, Written, batch
from kirim.store.rows import Row
from kirim.store.sequence import TIME, Operation, Query
from kirim.topics import (
    Subscription,
    TopicCounts,
    TopicEvent,
    TopicEventStatus,
    TopicInfo,
    is_edge,
)


def subscription_from(row: Row, *, created: bool = False) -> Subscription:
    """A row of ``kirim_topic_subscriptions``."""
    removed = row["removed_seq"]
    removed_at = row["removed_at"]
    return Subscription(
        topic=row["topic"],
        recipient_id=row["recipient_id"],
        added_seq=int(row["added_seq"]),
        added_at=float(row["added_at"]),
        removed_seq=None if removed is None else int(removed),
        removed_at=None if removed_at is None else float(removed_at),
        created=created,
    )


def event_from(row: Row, *, created: bool = False) -> TopicEvent:
    """A row of ``kirim_topic_events``."""

    def opt(name: str) -> float | None:
        value = row[name]
        return None if value is None else float(value)

    return TopicEvent(
        id=int(row["id"]),
        topic=row["topic"],
        type=row["type"],
        event_id=row["event_id"],
        data_json=row["data"],
        mark=int(row["mark"]),
        status=TopicEventStatus(row["status"]),
        cursor=row["cursor"],
        batches=int(row["batches"]),
        recipients=int(row["recipients"]),
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
        finished_at=opt("finished_at"),
        lease_owner=row["lease_owner"],
        lease_token=row["lease_token"],
        lease_expires_at=opt("lease_expires_at"),
        canceled_at=opt("canceled_at"),
        cancel_why=row["cancel_why"],
        created=created,
    )


def _bump(topic: str, now: float) -> Operation[int]:
    """The topic's next change number, its row locked until the commit."""
    rows = yield Query("bump_topic", {"topic": topic, "now": now})
    return int(rows[0]["seq"])


def subscribe(topic: str, recipient_id: str, given: float) -> Operation[Subscription]:
    """Subscribe the recipient (``created`` False: it was subscribed already)."""
    at = yield TIME
    now = at(given)
    seq = yield from _bump(topic, now)
    args = {"topic": topic, "recipient_id": recipient_id}
    live = yield Query("live_subscription", args)
    if live:
        return subscription_from(live[0])
    rows = yield Query("add_subscription", {**args, "seq": seq, "now": now})
    return subscription_from(rows[0], created=True)


def unsubscribe(topic: str, recipient_id: str, given: float) -> Operation[bool]:
    """End the recipient's subscription; False when it had none."""
    if text_problem(topic) is not None or text_problem(recipient_id) is not None:
        return False
    at = yield TIME
    now = at(given)
    args = {"topic": topic, "recipient_id": recipient_id}
    live = yield Query("live_subscription", args)
    if not live:
        return False
    seq = yield from _bump(topic, now)
    count = yield Query("end_subscription", {**args, "seq": seq, "now": now}, count=True)
    return bool(count)


def topics_of(recipient_id: str) -> Operation[list[str]]:
    """The topics the recipient is subscribed to now, by name."""
    if text_problem(recipient_id) is not None:
        return []
    rows = yield Query("topics_of", {"recipient_id": recipient_id})
    return [str(r["topic"]) for r in rows]


def subscribers(topic: str, after: str | None, limit: int) -> Operation[list[str]]:
    """Up to ``limit`` recipients subscribed to ``topic`` now, after ``after`` (their
    order: by id, bytewise)."""
    if text_problem(topic) is not None:
        return []
    args = {"topic": topic, "after": after or "", "limit": limit}
    rows = yield Query("subscribers_now", args)
    return [str(r["recipient_id"]) for r in rows]


def list_topics(limit: int) -> Operation[list[TopicInfo]]:
    """Topics by name, each with how many subscribers it has now."""
    rows = yield Query("list_topics", {"limit": limit})
    return [_info(r) for r in rows]


def _info(row: Row, recent: Sequence[TopicEvent] = ()) -> TopicInfo:
    return TopicInfo(
        topic=row["topic"],
        seq=int(row["seq"]),
        subscribers=int(row["subscribers"]),
        created_at=float(row["created_at"]),
        recent=tuple(recent),
    )


def topic_info(topic: str, recent: int) -> Operation[TopicInfo | None]:
    """The topic with its subscriber count and its ``recent`` latest events (one
    snapshot), or None when nobody ever subscribed or sent to it."""
    if text_problem(topic) is not None:
        return None
    rows = yield Query("topic_row", {"topic": topic})
    if not rows:
        return None
    events = yield Query("recent_topic_events", {"topic": topic, "limit": recent})
    return _info(rows[0], [event_from(e) for e in events])


def latest_events(limit: int) -> Operation[list[TopicEvent]]:
    """The ``limit`` latest topic events of every topic, newest first."""
    rows = yield Query("latest_topic_events", {"limit": limit})
    return [event_from(r) for r in rows]


def record_event(
    topic: str, type: str, event_id: str, data_json: str, given: float
) -> Operation[TopicEvent]:
    """Record an event to ``topic`` with its mark, or find it (``created`` False) when
    the same type, event id and topic were recorded before (a retried event)."""
    args = {"topic": topic, "type": type, "event_id": event_id}
    found = yield Query("find_topic_event", args)
    if found:
        return event_from(found[0])
    at = yield TIME
    now = at(given)
    mark = yield from _bump(topic, now)
    found = yield Query("find_topic_event", args)  # after the lock: a twin committed
    if found:
        return event_from(found[0])
    assert is_edge(None, TopicEventStatus.EXPANDING)
    row = {**args, "data": data_json, "mark": mark, "now": now}
    rows = yield Query("add_topic_event", row)
    return event_from(rows[0], created=True)


def claim_event(worker_id: str, given: float, lease: float) -> Operation[TopicEvent | None]:
    """Lease the oldest topic event still expanding whose lease is free or expired
    (store time), with a fresh token; None when there is none."""
    at = yield TIME
    now = at(given)
    args = {
        "owner": worker_id,
        "token": new_token(),
        "expires": now + lease,
        "now": now,
    }
    rows = yield Query("claim_topic_event", args)
    return event_from(rows[0]) if rows else None


def batch_of(event: TopicEvent, limit: int) -> Operation[list[str]]:
    """The next ``limit`` subscribers of ``event``'s fan-out after its cursor: the
    subscriptions live at its mark, in recipient order."""
    args = {
        "topic": event.topic,
        "mark": event.mark,
        "after": event.cursor or "",
        "limit": limit,
    }
    rows = yield Query("subscribers_at", args)
    return [str(r["recipient_id"]) for r in rows]


def expand_batch(
    event: TopicEvent,
    token: str,
    recipients: Sequence[str],
    items: TopicBatch,
    *,
    last: bool,
    given: float,
    lease: float,
) -> Operation[Written | None]:
    """One batch of ``event``'s fan-out: its cursor moved past ``recipients`` (their
    last) from ``event.cursor``, fenced by ``token``, and ``items`` (their deliveries
    or runs) recorded; ``last``: the fan-out is done. None (nothing written): the lease
    is lost, or the batch was done by another."""
    at = yield TIME
    now = at(given)
    status = TopicEventStatus.DONE if last else TopicEventStatus.EXPANDING
    assert is_edge(TopicEventStatus.EXPANDING, status)
    args = {
        "id": event.id,
        "token": token,
        "before": event.cursor,
        "cursor": recipients[-1] if recipients else event.cursor,
        "n": len(recipients),
        "status": str(status),
        "now": now,
        "expires": now + lease,
    }
    moved = yield Query("advance_topic_event", args)
    if not moved:
        return None
    why = moved[0]["cancel_why"] if moved[0]["canceled_at"] is not None else None
    return (yield from batch(items, now, canceled=why))


def expanding() -> Operation[int]:
    """How many topic events are still expanding."""
    rows = yield Query("topic_events_expanding")
    return int(rows[0]["n"])


def counts() -> Operation[TopicCounts]:
    """How many topics, live subscriptions, and topic events pending (expanding, no
    batch yet), expanding (a batch or more) and done (one snapshot)."""
    rows = yield Query("topic_counts")
    row = rows[0]
    return TopicCounts(
        topics=int(row["topics"]),
        subscriptions=int(row["subscriptions"]),
        pending=int(row["pending"] or 0),
        expanding=int(row["expanding"] or 0),
        done=int(row["done"] or 0),
    )
