"""The operator's verbs, behind ``Kirim.get``, ``records``, ``dead_letters``,
``in_doubt``, ``cancel`` and ``retry``: the CLI, the HTTP API and the dashboard call
them and only render what they return.

A page of records is two statements in one transaction (the deliveries with their
latest jobs, then the attempts of all of them), never one query per delivery.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from kirim.channels import Channel
from kirim.errors import ActionRefused, NotFound, NotSettled
from kirim.model import (
    Attempt,
    AttemptStatus,
    DeliveryStatus,
    Doubt,
    JobStatus,
    Record,
    RecordFilter,
)
from kirim.providers.base import Reconcilable
from kirim.store.base import Store
from kirim.text import stored_text
from kirim.worker.decisions import asks_provider

By = Literal["auto", "id", "key"]
#: the largest page a caller may ask for
MAX_PAGE = 10_000
#: seconds within which a retried delivery is taken to be sent again: a resend later
#: than its provider's dedup window may be a second copy
RESEND_WITHIN = 300.0


@dataclass(frozen=True, slots=True)
class Page:
    """A page of records; ``next_cursor`` (the last id shown) asks for the next one,
    ``None`` on the last page."""

    records: list[Record]
    next_cursor: int | None


async def get(store: Store, key_or_id: str | int, by: By = "auto") -> Record | None:
    if isinstance(key_or_id, int) and not isinstance(key_or_id, bool) and by == "auto":
        by = "id"
    return await store.record(str(key_or_id), by=by)  # one transaction


async def must_get(store: Store, key_or_id: str | int, by: By = "auto") -> Record:
    found = await get(store, key_or_id, by)
    if found is None:
        raise NotFound(not_found(key_or_id, by))
    return found


def not_found(key_or_id: str | int, by: By = "auto") -> str:
    what = {"auto": "id or idempotency key", "id": "id", "key": "idempotency key"}[by]
    return f"no delivery with {what} {str(key_or_id)!r}"


async def records(store: Store, where: RecordFilter | None, cursor: int | None, limit: int) -> Page:
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be 1 to {MAX_PAGE}, not {limit}")
    found = await store.records(where or RecordFilter(), cursor=cursor, limit=limit + 1)
    more = len(found) > limit
    shown = found[:limit]
    return Page(shown, shown[-1].delivery.id if more and shown else None)


async def dead_letters(store: Store, limit: int) -> list[Record]:
    dead = await store.dead_letters(limit=limit)
    attempts = await store.attempts_of_many([x.delivery.id for x in dead])
    return [Record(x.delivery, x.job, attempts[x.delivery.id]) for x in dead]


def job_state(record: Record) -> str:
    job = record.job
    return "none" if job is None else str(job.status)


async def cancel(
    store: Store, key_or_id: str | int, *, now: float, dead_only: bool, by: By = "auto"
) -> Record:
    record = await must_get(store, key_or_id, by)
    d, job = record.delivery, record.job
    if dead_only and (job is None or job.status is not JobStatus.DEAD):
        raise ActionRefused(d.id, "not_dead_lettered", _not_dead(record))
    if not await store.cancel(d.id, now=now):
        raise ActionRefused(
            d.id,
            "not_cancelable",
            f"cannot be canceled: it is {d.status} (only a pending, failed or in-doubt "
            "delivery that is not in flight can be)",
        )
    return await must_get(store, d.id, "id")


async def retry(
    store: Store,
    key_or_id: str | int,
    *,
    now: float,
    by: By = "auto",
    channels: Mapping[str, Channel] | None = None,
) -> Record:
    """Requeue a dead letter. A delivery whose earlier request may have arrived at a
    provider that can be asked keeps its doubt: the worker asks the provider before it
    sends anything (``asks_first``); otherwise the doubt is released."""
    record = await must_get(store, key_or_id, by)
    release = not asks_first(record, channels or {})
    if not await store.retry_dead(record.delivery.id, now=now, release=release):
        raise ActionRefused(record.delivery.id, "not_dead_lettered", _not_dead(record))
    return await must_get(store, record.delivery.id, "id")


def doubtful(record: Record) -> list[Attempt]:
    """The attempts of a record that may have reached their provider."""
    return [
        a for a in record.attempts if a.status in (AttemptStatus.REQUESTED, AttemptStatus.UNKNOWN)
    ]


def pinned(record: Record, channels: Mapping[str, Channel]) -> Channel | None:
    """The channel whose provider may have the delivery (its latest doubtful attempt's),
    if configured."""
    found = doubtful(record)
    if not found:
        return None
    return channels.get(found[-1].provider or record.delivery.channel)


def asks_first(record: Record, channels: Mapping[str, Channel]) -> bool:
    """Whether a retry of this record keeps its doubt for the worker to ask the provider
    (a channel with ``lookup``), instead of releasing it."""
    channel = pinned(record, channels)
    return channel is not None and asks_provider(channel)


def second_copy_possible(record: Record, channels: Mapping[str, Channel], *, now: float) -> bool:
    """Whether retrying this dead letter now may give its user a second copy: an earlier
    request may have reached a provider, the retry will not ask it first
    (``asks_first``), and no provider key will deduplicate the resend (an idempotent
    provider dedupes it while its dedup window lasts; a fallback of the route, which
    the retry starts over, has another provider, which dedupes nothing of the first's:
    explorer seed 8130)."""
    found = doubtful(record)
    if not found or asks_first(record, channels):
        return False
    home = channels.get(record.delivery.channel)
    # the retry starts the delivery's route over: any channel of it but the one that
    # may have the message would carry a second copy, whatever that one's key
    route = set(home.chain) if home is not None else {record.delivery.channel}
    for a in found:
        provider = a.provider or record.delivery.channel
        if route - {provider}:
            return True
        channel = channels.get(provider)
        if channel is None or not channel.idempotent:
            return True
        window = channel.dedup_window
        if window is not None and a.requested_at + window <= now + RESEND_WITHIN:
            return True
    return False


async def reconcile(
    store: Store,
    channels: Mapping[str, Channel],
    key_or_id: str | int,
    *,
    now: Callable[[], float],
    by: By = "auto",
) -> Record:
    """Ask the provider that may have a delivery in doubt whether it does, and settle the
    doubt either way (``Operator.reconcile``): found, sent (resolved); not found once no
    earlier request can still land, pending again while its job has attempts left (its
    route goes on), else failed (resolved: a retry then sends no second copy), or
    canceled when it was. Raises ``NotFound``, ``NotSettled`` (ask again at
    ``retry_at``) or ``ActionRefused`` (no doubt to settle, a channel that cannot be
    asked, the provider not answering, or the delivery moved on meanwhile)."""
    record = await must_get(store, key_or_id, by)
    d = record.delivery
    maybe = doubtful(record)
    if d.doubt not in (Doubt.HELD, Doubt.ASSUMED_SENT) or not maybe:
        raise ActionRefused(
            d.id, "not_in_doubt", f"has nothing to reconcile: it is {d.status_label}"
        )
    channel = pinned(record, channels)
    if channel is None or not asks_provider(channel):
        what = "is not configured" if channel is None else "cannot be asked (no lookup)"
        raise ActionRefused(d.id, "not_reconcilable", f"its provider {what}")
    until = max((a.settles_at or math.inf) for a in maybe)
    if until > now():
        raise NotSettled(d.id, until, "reconcile")
    provider = channel.provider
    assert isinstance(provider, Reconcilable)
    try:
        found = await provider.lookup(d.idempotency_key)
    except Exception as exc:
        raise ActionRefused(
            d.id, "lookup_failed", f"its provider could not be asked: {stored_text(str(exc))}"
        ) from None
    message_id = None if found is None else found.provider_message_id
    done = await store.reconcile(
        d.id, now=now(), found=found is not None, message_id=message_id, seen=len(record.attempts)
    )
    if not done:
        raise ActionRefused(d.id, "changed", "it changed while the provider was asked; ask again")
    return await must_get(store, d.id, "id")


def _not_dead(record: Record) -> str:
    return f"not dead-lettered (delivery {record.delivery.status}, job {job_state(record)})"


IN_DOUBT = RecordFilter(status=DeliveryStatus.IN_DOUBT)
#: every delivery, oldest first (a report that reads them all, page by page)
EVERY = RecordFilter(oldest_first=True)
