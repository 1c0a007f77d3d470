"""What an enqueue does beyond inserting deliveries, written once for both backends:
events into digests (``kirim.store.digests``), then the throttle of the deliveries it
made (``kirim.store.throttle``), in the enqueue's transaction.

Each backend inserts the plain deliveries its own way (one statement per batch, a
suppressed one recorded ``suppressed`` at once), then runs ``admit`` in the same
transaction when ``needed``. Locks are taken in one order in every transaction: the
deliveries' keys, the digests (in stream order), the throttle counters (in scope
order), so two enqueues never wait for each other in a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence

from kirim import limits
from kirim.errors import InvalidNotification
from kirim.model import EnqueueResult
from kirim.store import digests, throttle
from kirim.store.base import NewDelivery
from kirim.store.rows import evolve
from kirim.store.sequence import TIME, Operation

__all__ = ["admit", "needed", "plain", "refuse_unstorable"]


def refuse_unstorable(items: Sequence[NewDelivery]) -> None:
    """The store's last guard, before any statement: ``InvalidNotification`` naming the
    field of an item over a limit of ``kirim.limits`` (a ``NewDelivery`` built by hand;
    ``notify()`` and the fan-out refuse them first), so that no index is given a row it
    cannot hold, on either backend."""
    for it in items:
        fields: list[tuple[str, str | None, limits.Limit]] = [
            ("idempotency_key", it.idempotency_key, limits.KEY),
            ("event_id", it.event_id, limits.EVENT_ID),
            ("recipient", it.recipient, limits.RECIPIENT),
            ("channel", it.channel, limits.CHANNEL),
            ("recipient_id", it.recipient_id, limits.RECIPIENT_ID),
            ("type", it.type, limits.TYPE),
        ]
        if it.digest is not None:
            fields.append(("digest stream", it.digest.stream, limits.STREAM))
        if it.throttle is not None:
            fields.append(("throttle scope", it.throttle.scope, limits.STREAM))
        for name, value, limit in fields:
            if value is not None and (problem := limit.problem(value)) is not None:
                raise InvalidNotification(f"{name} {problem}")


def plain(item: NewDelivery) -> bool:
    """Whether the backend's own insert records ``item`` (else ``admit`` does: an event
    for a digest)."""
    return not digests.gathers(item)


def needed(items: Sequence[NewDelivery]) -> bool:
    """Whether ``admit`` has anything to do for ``items``."""
    return any(it.throttle is not None or not plain(it) for it in items)


def admit(
    items: Sequence[NewDelivery],
    inserted: Sequence[EnqueueResult | None],
    given: float,
) -> Operation[list[EnqueueResult]]:
    """Every item's result: ``inserted[i]`` for a plain item (the backend's insert), the
    digest's delivery for an event (None in ``inserted``); then the throttle of each
    delivery made here. ``given``: the caller's now (``TIME`` gives the store's)."""
    at = yield TIME
    now = at(given)
    events = [i for i, r in enumerate(inserted) if r is None]
    gathered: dict[int, EnqueueResult] = {}
    made = [i for i, r in enumerate(inserted) if r is not None and r.created]
    if events:
        gathered, by_events = yield from digests.gather(items, events, now)
        made = sorted([*made, *by_events])
    results = [r if r is not None else gathered[i] for i, r in enumerate(inserted)]
    results = yield from throttle.apply(items, results, made, now)
    # the other events of a digest the throttle just stopped or moved see it as it is
    mine = set(made)
    final = {results[i].delivery.id: results[i] for i in mine}
    return [
        r if i in mine or r.delivery.id not in final else _as(final[r.delivery.id], r)
        for i, r in enumerate(results)
    ]


def _as(final: EnqueueResult, result: EnqueueResult) -> EnqueueResult:
    """``final``'s delivery and job, with ``result``'s own ``created``."""
    return evolve(final, created=result.created)
