"""The store's reads and the HTTP service's tokens, written once for both drivers.

Each function is an ``Operation`` (``kirim.store.sequence``) that ``SQLStore`` runs
in one transaction (or, a read of one statement, in autocommit). The rules every
read follows on every driver: an id is ASCII digits from 1 (``validation.as_id``); a
text no column can hold (a NUL, a lone surrogate: ``text_problem``) names nothing; a
negative limit is no limit (``limit``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from kirim.model import Attempt, Delivery, Job, Record, RecordFilter
from kirim.store.base import ActivityBucket, ApiToken, DeadLetter, QueueStats, Waiting, waiting_from
from kirim.store.rows import (
    attempt_from,
    attempts_by_delivery,
    delivery_from,
    job_from,
    must_job,
    record_args,
    records_from,
    token_from,
)
from kirim.store.rules import queue_stats as stats_from
from kirim.store.sequence import TIME, Now, Operation, Query
from kirim.validation import as_id, text_problem


def limit(n: int) -> int | None:
    """A statement's LIMIT: None (no limit) for a negative one."""
    return None if n < 0 else n


def _text(value: str) -> bool:
    """Whether a stored text can be ``value`` (else nothing has it)."""
    return text_problem(value) is None


# -- the worker's idle loop -------------------------------------------------------------


def ping() -> Operation[None]:
    yield Query("ping")


def next_run_at() -> Operation[float | None]:
    [row] = yield Query("next_run_at")
    return None if row["run_at"] is None else float(row["run_at"])


def next_due_in(given: float) -> Operation[float | None]:
    now = yield Now(given)
    [row] = yield Query("next_due_in", {"now": now})
    return None if row["due_in"] is None else float(row["due_in"])


def in_flight() -> Operation[int]:
    [row] = yield Query("count_running")
    return int(row["n"])


def waiting(given: float) -> Operation[Waiting]:
    now = yield Now(given)
    return waiting_from((yield Query("waiting_jobs", {"now": now})))


def queue_stats(given: float) -> Operation[QueueStats]:
    at = yield TIME
    now = at(given)
    by_status, [due] = yield (
        Query("deliveries_by_status_doubt"),
        Query("due_jobs_summary", {"now": now}),
    )
    return stats_from(by_status, int(due["n"]), due["oldest"], now)


# -- operators ----------------------------------------------------------------------------


def get_delivery(key_or_id: str, by: Literal["auto", "id", "key"]) -> Operation[Delivery | None]:
    """By idempotency key, then by id (``by``: only one of them)."""
    if by not in ("auto", "id", "key"):
        raise ValueError(f"by must be 'auto', 'id' or 'key', not {by!r}")
    found = []
    if by != "id" and _text(key_or_id):
        found = yield Query("delivery_by_key", {"key": key_or_id})
    number = as_id(key_or_id) if by != "key" else None
    if not found and number is not None:
        found = yield Query("delivery_by_id", {"id": number})
    return delivery_from(found[0]) if found else None


def get_job(delivery_id: int) -> Operation[Job | None]:
    found = yield Query("latest_job", {"delivery_id": delivery_id})
    return job_from(found[0]) if found else None


def record(key_or_id: str, by: Literal["auto", "id", "key"]) -> Operation[Record | None]:
    """One delivery (as ``get_delivery`` finds it) with its latest job and its attempts,
    in one snapshot."""
    delivery = yield from get_delivery(key_or_id, by)
    if delivery is None:
        return None
    args = {"delivery_id": delivery.id}
    job, attempts = yield (Query("latest_job", args), Query("attempts_of", args))
    return Record(delivery, job_from(job[0]) if job else None, [attempt_from(a) for a in attempts])


def records(where: RecordFilter, cursor: int | None, n: int) -> Operation[list[Record]]:
    """A page, then its attempts, in one snapshot."""
    name, args = record_args(where, cursor, n)
    found = yield Query(name, args)
    ids = [r["id"] for r in found]
    return records_from(found, (yield Query("attempts_of_many", {"ids": ids})))


def attempts_of_many(delivery_ids: Sequence[int]) -> Operation[dict[int, list[Attempt]]]:
    ids = list(delivery_ids)
    if not ids:
        return {}
    return attempts_by_delivery(ids, (yield Query("attempts_of_many", {"ids": ids})))


def dead_letters(n: int) -> Operation[list[DeadLetter]]:
    found = yield Query("dead_letters", {"limit": limit(n)})
    return [DeadLetter(delivery=delivery_from(r), job=must_job(r)) for r in found]


def counts() -> Operation[dict[str, dict[str, int]]]:
    d, j = yield (Query("count_deliveries"), Query("count_jobs"))
    return {
        "deliveries": {r["status"]: int(r["n"]) for r in d},
        "jobs": {r["status"]: int(r["n"]) for r in j},
    }


def search_deliveries(text: str, n: int) -> Operation[list[Delivery]]:
    if not _text(text):
        return []
    number = as_id(text)
    args = {"id": -1 if number is None else number, "text": text, "limit": limit(n)}
    return [delivery_from(r) for r in (yield Query("search_deliveries", args))]


def figures() -> Operation[list[dict[str, Any]]]:
    return [dict(r) for r in (yield Query("figures"))]


def activity(since: float, until: float, bucket: float) -> Operation[list[ActivityBucket]]:
    if ActivityBucket.span(since=since, until=until, bucket=bucket) == 0:
        return []
    args = {"since": float(since), "until": float(until), "bucket": float(bucket)}
    found = yield Query("activity", args)
    return ActivityBucket.series(found, since=since, until=until, bucket=bucket)


# -- the HTTP service's tokens ----------------------------------------------------------


def create_token(
    name: str, token_hash: str, prefix: str, given: float
) -> Operation[ApiToken | None]:
    now = yield Now(given)
    args = {"name": name, "hash": token_hash, "prefix": prefix, "now": now}
    found = yield Query("insert_token", args)
    return token_from(found[0]) if found else None


def verify_token(token_hash: str) -> Operation[ApiToken | None]:
    if not _text(token_hash):
        return None
    found = yield Query("token_by_hash", {"hash": token_hash})
    return token_from(found[0]) if found else None


def revoke_token(name_or_id: str, given: float) -> Operation[ApiToken | None]:
    """By name, else by id."""
    if not _text(name_or_id):
        return None
    now = yield Now(given)
    found = yield Query("revoke_token_by_name", {"name": name_or_id, "now": now})
    number = as_id(name_or_id) if not found else None
    if number is not None:
        found = yield Query("revoke_token_by_id", {"id": number, "now": now})
    return token_from(found[0]) if found else None


def list_tokens(include_revoked: bool) -> Operation[list[ApiToken]]:
    return [token_from(r) for r in (yield Query("tokens", {"all": include_revoked}))]
