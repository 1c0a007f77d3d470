"""Digests: the events of one window gathered into one delivery, written once for both
backends (``kirim_digests``, ``kirim_digest_events``).

A *stream* (type, digest key, channel: ``DigestEvent.stream``) has at most one digest
per window (windows of ``DigestEvent.window`` seconds aligned on the epoch, store
time). Its delivery's idempotency key is derived from the stream and the window's
start (``digest_key``), so two hosts that take the first events of a window at once
make one delivery: the UNIQUE ledger decides.

``gather`` (the enqueue) puts each event in its stream's digest for the window that
holds ``now``. The digest's row is taken with an upsert that locks it
(``open_digest``), then the event is inserted once per (stream, event id)
(``kirim_digest_events_once``), then the digest's delivery is made if the digest has
none yet, due when its window ends. A digest already sealed is passed by: the event
goes to the next window's.

``seal`` (the worker, after its claim and before its intent) marks the digest sealed,
reads its events and writes the delivery's payload, fenced by the claim token. It
locks the digest's row first, so a seal and an event never interleave: an event
committed before the seal is in the payload; one that comes after finds the digest
sealed and goes to the next. Each event is in exactly one digest, once.

Retention (``kirim.store.retention``): when a digest's delivery is pruned, the digest
goes and its events' data with it, but each event's row stays (``pruned_at`` set) for
as long as the delivery's key tombstone: an event given again finds its row, then the
tombstone, and is answered ``pruned`` (nothing made). Once the tombstone has expired,
a row still kept (prune deletes them in bounded batches) is forgotten here and the
event is new again: the tombstone is the one clock of both.

Lock order: digests in stream order, then the deliveries they make (the enqueue);
the digest, then its delivery (the seal).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from kirim.errors import StoreError
from kirim.keys import canonical_json, payload_hash
from kirim.model import Delivery, DeliveryStatus, EnqueueResult
from kirim.store.base import Compose, DigestEvent, NewDelivery
from kirim.store.retention import delivery_from_tombstone, key_hash
from kirim.store.rows import delivery_from, evolve, job_from, job_of
from kirim.store.sequence import TIME, Operation, Query
from kirim.store.throttle import MAX_WINDOWS, window_start


def digest_key(stream: str, start: float) -> str:
    """The idempotency key of the digest of ``stream`` for the window at ``start``:
    sha256 of ``digest:{stream}:window:{start}``."""
    text = f"digest:{stream.replace('%', '%25').replace(':', '%3A')}:window:{start:.6f}"
    return hashlib.sha256(text.encode()).hexdigest()


def gathers(item: NewDelivery) -> bool:
    """Whether ``item`` is an event for a digest (a suppressed one is recorded as it is)."""
    return item.digest is not None and item.suppressed is None


def gather(
    items: Sequence[NewDelivery], which: Sequence[int], now: float
) -> Operation[tuple[dict[int, EnqueueResult], list[int]]]:
    """Put the events of ``items[i]`` for ``i`` in ``which`` into their digests.

    Returns each one's result, the digest's delivery (``created``: the event was new,
    this enqueue added it), and the indexes whose event made its digest's delivery
    (the throttle counts those, ``kirim.store.throttle``). Streams are taken in order,
    the lock order of every transaction."""
    out: dict[int, EnqueueResult] = {}
    made: list[int] = []
    for i in sorted(which, key=lambda i: (_event(items[i]).stream, _event(items[i]).event_id, i)):
        out[i], fresh = yield from _gather_one(items[i], now)
        if fresh:
            made.append(i)
    return out, made


def _event(item: NewDelivery) -> DigestEvent:
    assert item.digest is not None
    return item.digest


def _gather_one(item: NewDelivery, now: float) -> Operation[tuple[EnqueueResult, bool]]:
    """One event into its digest: its result, and whether it made the delivery."""
    ev = _event(item)
    held = yield from _held(ev)
    if held is not None:  # given before (a retried enqueue): where it went
        key = str(held["digest_key"])
        found = yield from _find(key)
        if found is not None:
            return found, False
        if held["pruned_at"] is None:
            raise StoreError(f"the delivery of digest {key!r} vanished during enqueue; try again")
        # its digest was pruned and the tombstone has expired since: the event is free
        yield Query("forget_digest_event", {"id": held["id"]}, count=True)
    digest = yield from _open(ev, now)
    added = yield Query(
        "add_digest_event",
        {
            "stream": ev.stream,
            "event_id": ev.event_id,
            "digest_key": digest["key"],
            "data": ev.data_json,
            "now": now,
        },
    )
    if not added:  # another transaction took it meanwhile (its insert was waited for)
        held = yield from _held(ev)
        if held is None:
            raise StoreError(f"digest event {ev.event_id!r} vanished during enqueue; try again")
        return (yield from _delivery_of(str(held["digest_key"]))), False
    if digest["delivery_id"] is not None:
        found = yield from _delivery_of(digest["key"])
        return evolve(found, created=True), False
    return (yield from _make(item, digest["key"], float(digest["window_start"]), now)), True


def _held(ev: DigestEvent) -> Operation[Any]:
    """The row of this event, if a digest holds it already (``digest_key``, and
    ``pruned_at`` when that digest was pruned), else None."""
    rows = yield Query("digest_event", {"stream": ev.stream, "event_id": ev.event_id})
    return rows[0] if rows else None


def _open(ev: DigestEvent, now: float) -> Operation[Any]:
    """The open digest of the stream for the window of ``now``, or the first later one
    not sealed; its row locked."""
    start = window_start(now, ev.window)
    for _ in range(MAX_WINDOWS):
        args = {
            "key": digest_key(ev.stream, start),
            "stream": ev.stream,
            "window_start": start,
            "window_end": start + ev.window,
            "now": now,
        }
        [row] = yield Query("open_digest", args)
        if row["sealed_at"] is None:
            return row
        start += ev.window
    raise StoreError(f"digest stream {ev.stream!r}: {MAX_WINDOWS} windows sealed ahead")


def _make(item: NewDelivery, key: str, start: float, now: float) -> Operation[EnqueueResult]:
    """The digest's delivery, due when its window ends (or at the item's ``run_at``,
    if later), linked to the digest."""
    ev = _event(item)
    rows = yield Query(
        "insert_digest_delivery",
        {
            "key": key,
            "key_hash": key_hash(key),
            "event_id": ev.event_id,
            "recipient": item.recipient,
            "channel": item.channel,
            "payload": item.payload_json,
            "payload_hash": item.payload_hash,
            "type": item.type,
            "recipient_id": item.recipient_id,
            "now": now,
        },
    )
    if not rows:  # the key is taken (a digest row lost, a tombstone kept): use what is there
        found = yield from _delivery_of(key)
        yield Query("link_digest", {"key": key, "delivery_id": found.delivery.id}, count=True)
        if found.pruned:  # a digest made again for a pruned one: it is pruned too
            args = {"key": key, "key_hash": key_hash(key)}
            yield Query("mark_digest_pruned", args, count=True)
        return evolve(found, created=True)
    delivery = delivery_from(rows[0])
    due = max(start + ev.window, item.run_at or 0.0)
    [job], _linked, _woke = yield (
        Query(
            "insert_digest_job",
            {
                "delivery_id": delivery.id,
                "run_at": due,
                "max_attempts": item.max_attempts,
                "now": now,
            },
        ),
        Query("link_digest", {"key": key, "delivery_id": delivery.id}, count=True),
        Query("notify", optional=True),
    )
    return EnqueueResult(delivery=delivery, job=job_from(job), created=True)


def _delivery_of(key: str) -> Operation[EnqueueResult]:
    """The digest delivery of ``key`` with its latest job (``created=False``), or the
    tombstone it left when it was pruned."""
    found = yield from _find(key)
    if found is None:
        raise StoreError(f"the delivery of digest {key!r} vanished during enqueue; try again")
    return found


def _find(key: str) -> Operation[EnqueueResult | None]:
    """``_delivery_of``, or None when the delivery is gone and so is its tombstone."""
    rows = yield Query("digest_delivery", {"key": key})
    if rows:
        return EnqueueResult(delivery=delivery_from(rows[0]), job=job_of(rows[0]), created=False)
    rows = yield Query("digest_tombstone", {"key_hash": key_hash(key)})
    if rows:
        pruned = delivery_from_tombstone(rows[0], key)
        return EnqueueResult(delivery=pruned, job=None, created=False, pruned=True)
    return None


# -- the seal (the worker, after its claim) ------------------------------------------


def seal(
    delivery_id: int, token: str, given: float, compose: Compose
) -> Operation[Delivery | None]:
    """Seal the digest of a claimed delivery and write its payload (``compose`` of its
    events), fenced by the claim token. None: the claim no longer holds (write
    nothing, send nothing). A delivery already sealed (an earlier claim's) is returned
    as recorded, and one that is no digest as it is."""
    found, rows = yield (
        Query("lock_digest_of", {"delivery_id": delivery_id}),
        Query("lock_deliveries", {"ids": [delivery_id]}),
    )
    at = yield TIME  # after the locks
    now = at(given)
    if not rows:
        return None
    d = delivery_from(rows[0])
    if d.status is not DeliveryStatus.PROCESSING or d.claim_token != token:
        return None
    if not found or found[0]["sealed_at"] is not None:
        return d
    key = str(found[0]["key"])
    events = yield Query("digest_events_of", {"key": key})
    payload = compose(
        d,
        [
            {"event_id": e["event_id"], "data": json.loads(e["data"]), "at": float(e["created_at"])}
            for e in events
        ],
    )
    text = canonical_json(payload)
    digest = payload_hash(text)
    yield (
        Query("seal_digest", {"key": key, "now": now}, count=True),
        Query(
            "write_digest_payload",
            {"id": d.id, "payload": text, "payload_hash": digest, "now": now},
            count=True,
        ),
    )
    return evolve(d, payload=json.loads(text), payload_hash=digest, updated_at=now)


__all__ = ["Compose", "digest_key", "gather", "gathers", "seal"]
