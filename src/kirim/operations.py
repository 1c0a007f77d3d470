"""The operator's verbs, behind ``Kirim.get``, ``records``, ``dead_letters``,
``in_doubt``, ``cancel`` and ``retry``: the CLI, the HTTP API and the dashboard call
them and only render what they return.

A page of records is two statements in one transaction (the deliveries with their
latest jobs, then the attempts of all of them), never one query per delivery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kirim.errors import ActionRefused, NotFound
from kirim.model import DeliveryStatus, JobStatus, Record, RecordFilter
from kirim.store.base import Store

By = Literal["auto", "id", "key"]
#: the largest page a caller may ask for
MAX_PAGE = 10_000


@dataclass(frozen=True, slots=True)
class Page:
    """A page of records; ``next_cursor`` (the last id shown) asks for the next one,
    ``None`` on the last page."""

    records: list[Record]
    next_cursor: int | None


async def get(store: Store, key_or_id: str | int, by: By = "auto") -> Record | None:
    if isinstance(key_or_id, int) and not isinstance(key_or_id, bool) and by == "auto":
        by = "id"
    delivery = await store.get_delivery(str(key_or_id), by=by)
    if delivery is None:
        return None
    attempts = await store.attempts_of_many([delivery.id])
    return delivery, await store.get_job(delivery.id), attempts[delivery.id]


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
    return Page(shown, shown[-1][0].id if more and shown else None)


async def dead_letters(store: Store, limit: int) -> list[Record]:
    dead = await store.dead_letters(limit=limit)
    attempts = await store.attempts_of_many([x.delivery.id for x in dead])
    return [(x.delivery, x.job, attempts[x.delivery.id]) for x in dead]


def job_state(record: Record) -> str:
    job = record[1]
    return "none" if job is None else str(job.status)


async def cancel(
    store: Store, key_or_id: str | int, *, now: float, dead_only: bool, by: By = "auto"
) -> Record:
    record = await must_get(store, key_or_id, by)
    d, job, _ = record
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


async def retry(store: Store, key_or_id: str | int, *, now: float, by: By = "auto") -> Record:
    record = await must_get(store, key_or_id, by)
    if not await store.retry_dead(record[0].id, now=now):
        raise ActionRefused(record[0].id, "not_dead_lettered", _not_dead(record))
    return await must_get(store, record[0].id, "id")


def _not_dead(record: Record) -> str:
    return f"not dead-lettered (delivery {record[0].status}, job {job_state(record)})"


IN_DOUBT = RecordFilter(status=DeliveryStatus.IN_DOUBT)
#: every delivery, oldest first (a report that reads them all, page by page)
EVERY = RecordFilter(oldest_first=True)
