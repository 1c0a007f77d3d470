"""Random store call sequences played on two stores at once, compared step by step:
their results, their rows and what their reads say (``first_difference``). The
reference is the careful way (``SQLStore.careful_only``) on SQLite; the other, PostgreSQL
(``test_postgres_only``) or SQLite's fenced finish (``test_fenced_finish``)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from kirim.errors import StoreError
from kirim.model import AttemptStatus, DeliveryStatus, Doubt, JobStatus, RecordFilter
from kirim.store.base import AttemptOutcome, Claim, Finish, Lease
from kirim.store.postgres import PostgresStore
from kirim.store.sqlite import SQLiteStore
from kirim.store.sqlite.driver import Q as SQLITE_Q
from notify_kit import intent_of, numbered

Store = SQLiteStore | PostgresStore

#: the token fences of SQLite's fenced finish, by statement
SQLITE_FENCES = {
    "finish_fenced_jobs": ("lease_token = :token", "d.claim_token = :token"),
    "finish_fenced_deliveries": ("claim_token = :token",),
}


def unfence_sqlite(monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's fenced finish with its token fences taken out (a mutation the tests
    must catch): it writes a finish whose claim was lost."""
    for name, fences in SQLITE_FENCES.items():
        sql = SQLITE_Q[name]
        for fence in fences:
            assert fence in sql, (name, fence)
            sql = sql.replace(fence, "1")
        monkeypatch.setitem(SQLITE_Q, name, sql)


class _Names:
    """Claim tokens are random: name them in order of appearance to compare backends."""

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}

    def __call__(self, value: Any, name: str = "") -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if isinstance(value, dict):
            return {k: self(v, k) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self(v) for v in value]
        if name.endswith("token") and value is not None:
            return self.tokens.setdefault(value, f"T{len(self.tokens)}")
        return float(value) if name.endswith("_at") and isinstance(value, int) else value


async def _tables(store: Store) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for table in ("kirim_deliveries", "kirim_jobs", "kirim_attempts"):
        sql = f"SELECT * FROM {table} ORDER BY id"
        if isinstance(store, SQLiteStore):
            out[table] = await store.driver._tx(
                lambda c, q=sql: [dict(r) for r in c.execute(q)], write=False
            )
        else:
            async with store.driver.cursor(transaction=False) as cur:
                await cur.execute(sql)
                out[table] = [dict(r) for r in await cur.fetchall()]
    return out


async def _reads(store: Store, now: float, step: int) -> list[Any]:
    """What the read methods say about the same state."""
    some = str(step % 7)
    return [
        await store.counts(),
        await store.next_run_at(),
        await store.in_flight(),
        await store.queue_stats(now=now),
        await store.dead_letters(limit=3),
        await store.records(
            RecordFilter(status=DeliveryStatus.PENDING, oldest_first=True), cursor=1, limit=2
        ),
        await store.get_delivery(some),
        await store.get_job(step % 7),
        (await store.attempts_of_many([step % 7]))[step % 7],
    ]


def _finish(c: Claim, plan: tuple[Any, ...], now: float) -> Finish:
    request, status, delivery, job, doubt, message, run_at = plan
    outcome = None
    if request is not None:
        ok = status is AttemptStatus.SUCCEEDED
        outcome = AttemptOutcome(
            provider_request_id=request,
            status=status,
            provider_message_id=message if ok else None,
            error=None if ok else "boom",
            completed_at=now,
        )
    return Finish(
        delivery_id=c.delivery.id,
        job_id=c.job.id,
        token=c.token,
        now=now,
        attempt=outcome,
        delivery_status=delivery,
        doubt=doubt,
        provider_message_id=message,
        error="e",
        job_status=job,
        run_at=run_at,
    )


_PLAIN = (DeliveryStatus.SENT, DeliveryStatus.FAILED, DeliveryStatus.PENDING)


def _call(rng: random.Random, now: float, claims: list[Any], intents: list[Any]) -> Any:
    """A random store call: (method, arguments for backend i, keyword arguments)."""
    op = rng.choice(
        [
            *("enqueue", "claim", "claim", "record_intents", "record_intents", "finish"),
            *("finish", "heartbeat", "reap", "release", "retry_dead", "cancel"),
        ]
    )
    if op == "enqueue":
        batch = [numbered(rng.randrange(6), run_at=now + rng.choice([0, 0, 5])) for _ in range(3)]
        return op, lambda i: (batch,), {"now": now}
    if op == "claim":
        kw = {"worker_id": rng.choice("ab"), "now": now, "lease": 10.0, "limit": rng.randint(1, 4)}
        return op, lambda i: (), kw
    if op in ("retry_dead", "cancel"):
        delivery_id = rng.randint(1, 6)
        return op, lambda i: (delivery_id,), {"now": now}
    if op == "reap" or not claims:
        return "reap", lambda i: (), {"now": now}
    picked = [rng.randrange(len(claims)) for _ in range(rng.randint(1, 3))]
    if op == "record_intents":
        ids = [f"req-{len(intents) + n}" for n in range(len(picked))]
        intents += zip(picked, ids, strict=True)
        pairs = list(zip(picked, ids, strict=True))
        return op, lambda i: ([intent_of(claims[p][i], r) for p, r in pairs],), {}
    if op in ("heartbeat", "release"):
        kw = {"now": now, "lease": 10.0} if op == "heartbeat" else {"now": now}

        def leases(i: int) -> tuple[list[Lease]]:
            cs = [claims[p][i] for p in picked]
            return ([Lease(job_id=c.job.id, delivery_id=c.delivery.id, token=c.token) for c in cs],)

        return op, leases, kw
    plans = [
        (
            p,
            (
                rng.choice([r for q, r in intents if q == p] + [None, "req-never"]),
                rng.choice(list(AttemptStatus)[1:]),
                # the plain finishes (sent, failed, again; no doubt) drawn more often
                rng.choice([*DeliveryStatus, *_PLAIN, *_PLAIN]),
                rng.choice([JobStatus.COMPLETED, JobStatus.RETRY_SCHEDULED, JobStatus.DEAD]),
                rng.choice([None, None, None, Doubt.HELD, Doubt.ASSUMED_SENT]),
                rng.choice([None, "pm-1", "pm-2"]),
                rng.choice([None, now + 3]),
            ),
        )
        for p in picked
    ]
    return op, lambda i: ([_finish(claims[p][i], plan, now) for p, plan in plans],), {}


async def first_difference(backends: tuple[Store, Store], seed: int) -> str | None:
    """Where a random call sequence first gives other results, rows or reads on the
    second of ``backends`` than on the first (None: nowhere). Opens, migrates and closes
    both."""
    names = (_Names(), _Names())
    rng, now = random.Random(seed), 1000.0
    claims: list[tuple[Claim, Claim]] = []
    intents: list[tuple[int, str]] = []
    for store in backends:
        await store.open()
        await store.migrate()
    try:
        for step in range(120):
            now += rng.choice([0, 0, 0.5, 1, 5, 11])
            method, args, kwargs = _call(rng, now, claims, intents)
            results = []
            for i, store in enumerate(backends):
                try:
                    result = await getattr(store, method)(*args(i), **kwargs)
                except StoreError as exc:
                    result = type(exc).__name__
                results.append(result)
            if method == "claim" and isinstance(results[0], list):
                claims += zip(results[0], results[1], strict=True)
            where = f"seed {seed} step {step} {method}"
            if names[0](results[0]) != names[1](results[1]):
                return f"{where}: results"
            tables = [await _tables(store) for store in backends]
            if names[0](tables[0]) != names[1](tables[1]):
                return f"{where}: rows"
            reads = [await _reads(store, now, step) for store in backends]
            if names[0](reads[0]) != names[1](reads[1]):
                return f"{where}: reads"
    finally:
        for store in backends:
            await store.close()
    return None
