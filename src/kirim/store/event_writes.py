"""An event's writes in one transaction (``Store.record_event``), for both backends.

``notify_event`` records an event as one operation, so that nothing it means is ever
half written:

- its deliveries (``intake.enqueue``), or, for a workflow type, its runs
  (``flows.start``);
- the cancellations it causes: every waiting run of a type whose ``cancel_on`` names
  the event, with the same value of the type's ``cancel_key`` (``cancel_matching``);
- the HTTP request it answers, if any: that request's row completed with the response
  kept for replays, or released (``intake.settle``).

An event to a topic is recorded with its cancellations (``topic_event``); each batch of
its fan-out then writes what ``notify_event`` would for those subscribers
(``TopicBatch``: the deliveries of a plain type, the runs of a workflow type), in the
batch's own transaction with the fan-out's progress (``kirim.store.topics``).

One transaction, the store's (``driver.run``) or the caller's (``connection=``:
``driver.run_in``): a crash before its commit leaves none of it, so a retry does it
all; a caller who rolls its transaction back has canceled nothing; and a replayed
request's kept answer is never the answer of an event whose cancellations were lost.

Lock order: the event's new rows (in key order), then the runs it cancels in id order,
each with its deliveries (``flows.cancel``), as an operator's cancel takes them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kirim.model import EnqueueResult
from kirim.runs import cancel_value
from kirim.store import flows, intake
from kirim.store.base import NewDelivery, Refuse, StoredResponse
from kirim.store.sequence import TIME, Operation, Query
from kirim.topics import TopicEvent


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelBy:
    """Cancel the waiting runs of ``type`` whose cancellation value is ``value``, and
    the fan-outs under way of its topic events whose data has ``value`` for ``key``
    (the type's ``cancel_key``)."""

    type: str
    key: str
    value: str
    why: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Written:
    """What an event's transaction wrote."""

    deliveries: tuple[EnqueueResult, ...] = ()
    runs: tuple[flows.Started, ...] = ()
    #: the runs it canceled (those it found over already are left out)
    canceled: tuple[flows.Canceled, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """The HTTP request an event answers: ``respond`` gives the response to keep for
    replays (None releases the key); what it raises rolls the whole event back."""

    key: str
    token: str
    respond: Callable[[Written], StoredResponse | None]
    fingerprint: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EventWrite:
    """An event to record: its deliveries or its runs, the cancellations it causes,
    and the request it answers."""

    deliveries: Sequence[NewDelivery] = ()
    runs: Sequence[flows.NewRun] = ()
    cancels: Sequence[CancelBy] = ()
    request: Request | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicBatch:
    """What one batch of a topic event's fan-out records for its subscribers: the
    deliveries of a plain type's event, or the runs of a workflow type's (one per
    subscriber, ``run_key(type, event_id, recipient_id)``). A batch cancels nothing:
    its topic event did, when it committed."""

    deliveries: Sequence[NewDelivery] = ()
    runs: Sequence[flows.NewRun] = ()


def batch(items: TopicBatch, given: float, *, canceled: str | None = None) -> Operation[Written]:
    """A fan-out batch's rows (``topics.expand_batch``, after its progress is fenced):
    its deliveries as ``enqueue`` records them, its runs as ``flows.start`` starts them
    (a key given again returns its row: nothing twice). ``canceled``: why a
    cancellation reached the fan-out before this batch: each run it starts is canceled
    at once, in its transaction (none of its steps is taken)."""
    results = (yield from intake.enqueue(items.deliveries, given)) if items.deliveries else []
    started = (yield from flows.start(items.runs, given)) if items.runs else []
    out: list[flows.Canceled] = []
    if canceled is not None:
        for run_id in sorted(s.run.id for s in started if s.created):
            done = yield from flows.cancel(run_id, canceled, given)
            if done is not None and done.changed:
                out.append(done)
    return Written(deliveries=tuple(results), runs=tuple(started), canceled=tuple(out))


def record(write: EventWrite, given: float, refuse: Refuse | None = None) -> Operation[Written]:
    """``Store.record_event``: the event's rows, its cancellations, its request's row.
    ``refuse`` (a key reused for another notification) raises inside the transaction,
    after the deliveries and before anything else: the event is rolled back whole."""
    results = (yield from intake.enqueue(write.deliveries, given)) if write.deliveries else []
    if refuse is not None:
        refuse(results)
    started = (yield from flows.start(write.runs, given)) if write.runs else []
    canceled = yield from cancel_matching(write.cancels, given)
    out = Written(deliveries=tuple(results), runs=tuple(started), canceled=tuple(canceled))
    if write.request is not None:
        r = write.request
        created = any(d.created for d in results) or any(s.created for s in started)
        first = results[0].delivery.id if results else None
        made = r.fingerprint if created else None
        yield from intake.settle([(r.key, r.token, r.respond(out), first, made)], given)
    return out


def topic_event(
    record_it: Operation[TopicEvent], cancels: Sequence[CancelBy], given: float
) -> Operation[TopicEvent]:
    """``Store.record_topic_event``: the topic event (``topics.record_event``), then
    the runs it cancels, in its transaction (the fan-out's deliveries come later, by
    batches: the cancellation does not wait for them)."""
    event = yield from record_it
    yield from cancel_matching(cancels, given)
    return event


def cancel_matching(cancels: Sequence[CancelBy], given: float) -> Operation[list[flows.Canceled]]:
    """Cancel what each of ``cancels`` names: first the matching topic events still
    fanning out (marked, in id order: their later batches start their runs canceled),
    then the waiting runs, in run id order (the lock order of concurrent
    cancellations); a run found over already is left out.

    The marks come first: each takes its topic event's row lock, so a batch of that
    fan-out under way commits before the runs are read (they are then canceled with
    the others), and a batch after it reads the mark (``topics.expand_batch``)."""
    yield from _cancel_fan_outs(cancels, given)
    found: dict[int, str] = {}
    for c in cancels:
        for run_id in (yield from flows.to_cancel(c.type, c.value)):
            found.setdefault(run_id, c.why)
    out = []
    if len(found) > 1:  # every run locked before a digest window (flows.lock_runs)
        yield from flows.lock_runs(list(found))
    for run_id in sorted(found):
        done = yield from flows.cancel(run_id, found[run_id], given)
        if done is not None and done.changed:
            out.append(done)
    return out


def _cancel_fan_outs(cancels: Sequence[CancelBy], given: float) -> Operation[None]:
    """Mark each topic event still fanning out whose type and value one of
    ``cancels`` names (the first one's reason kept)."""
    marks: dict[int, str] = {}
    for c in cancels:
        for row in (yield Query("expanding_topic_events_of", {"type": c.type})):
            value = _value_of(str(row["data"]), c.key)
            if value is not None and value == c.value:
                marks.setdefault(int(row["id"]), c.why)
    if not marks:
        return
    at = yield TIME
    now = at(given)
    for event_id in sorted(marks):
        args = {"id": event_id, "why": marks[event_id], "now": now}
        yield Query("cancel_topic_event", args, count=True)


def _value_of(data_json: str, key: str) -> str | None:
    """The cancellation value of an event's stored data (``runs.cancel_value``)."""
    try:
        data = json.loads(data_json)
    except ValueError:
        return None
    return cancel_value(data, key) if isinstance(data, dict) else None


__all__ = [
    "CancelBy",
    "EventWrite",
    "Request",
    "TopicBatch",
    "Written",
    "batch",
    "cancel_matching",
    "record",
    "topic_event",
]
