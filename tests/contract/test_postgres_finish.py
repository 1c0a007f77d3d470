"""The hot path's single statements on PostgreSQL (issue 24, item 2): the claim of fresh
deliveries (``claim_fresh``), which writes what the careful claim writes and leaves it
the rest; the plain finish, one fenced statement with no explicit row lock before it,
where a finish whose claim was lost writes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kirim.model import AttemptStatus, DeliveryStatus, JobStatus
from kirim.store import transitions
from kirim.store.base import AttemptOutcome, Claim, Finish, Intent
from kirim.store.postgres import PostgresStore
from kirim.store.postgres.driver import Q, drive
from kirim.store.transitions import FenceRaced
from kirim.testing import Checkpoints, FlakyProvider, ManualClock
from kirim.worker import WorkerSettings
from notify_kit import numbered

LEASE = 10.0


@pytest.fixture
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh PostgreSQL database (skipped, or failed in CI, without a server)."""
    from pg import fresh_database

    del tmp_path
    return fresh_database(request)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(database_url)
    await s.open()
    await s.migrate()
    yield s
    await s.close()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The named queries (``sql/``) every cursor sends from now on, in order."""
    names = {sql: name for name, sql in Q.items()}
    found: list[str] = []
    execute = psycopg.AsyncCursor.execute

    async def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if query in names:
            found.append(names[query])
        return await execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted)
    return found


async def claimed(store: PostgresStore, n: int, now: float, worker: str = "w1") -> list[Claim]:
    """``n`` deliveries claimed by ``worker``, each with its intent committed."""
    await store.enqueue([numbered(i) for i in range(n)], now=now)
    claims = await store.claim(worker_id=worker, now=now, lease=LEASE, limit=n)
    intents = [
        Intent(
            delivery_id=c.delivery.id,
            job_id=c.job.id,
            token=c.token,
            number=c.job.attempts,
            provider_request_id=f"req-{c.delivery.id}-{c.token[:6]}",
            worker_id=worker,
            requested_at=now,
        )
        for c in claims
    ]
    assert await store.record_intents(intents) == [True] * n
    return claims


def outcome(c: Claim, status: AttemptStatus, now: float) -> AttemptOutcome:
    ok = status is AttemptStatus.SUCCEEDED
    return AttemptOutcome(
        provider_request_id=f"req-{c.delivery.id}-{c.token[:6]}",
        status=status,
        provider_message_id=f"pm-{c.delivery.id}" if ok else None,
        error=None if ok else "refused",
        completed_at=now,
    )


def refused(c: Claim, *, run_at: float | None = None, delay: float | None = None) -> Finish:
    """``c``'s request refused for now (at 1001): the delivery pending again, its job
    scheduled again at ``run_at`` or after ``delay``."""
    return Finish(
        delivery_id=c.delivery.id,
        job_id=c.job.id,
        token=c.token,
        now=1001.0,
        attempt=outcome(c, AttemptStatus.FAILED_TRANSIENT, 1001.0),
        delivery_status=DeliveryStatus.PENDING,
        error="refused",
        job_status=JobStatus.RETRY_SCHEDULED,
        run_at=run_at,
        delay=delay,
    )


def plain(claims: list[Claim], now: float) -> list[Finish]:
    """Sent, sent, failed for good, and scheduled again: the common finishes."""
    a, b, c, d = claims
    return [
        Finish(
            delivery_id=a.delivery.id,
            job_id=a.job.id,
            token=a.token,
            now=now,
            attempt=outcome(a, AttemptStatus.SUCCEEDED, now),
            delivery_status=DeliveryStatus.SENT,
            provider_message_id=f"pm-{a.delivery.id}",
        ),
        Finish(
            delivery_id=b.delivery.id,
            job_id=b.job.id,
            token=b.token,
            now=now,
            attempt=None,
            delivery_status=DeliveryStatus.SENT,
        ),
        Finish(
            delivery_id=c.delivery.id,
            job_id=c.job.id,
            token=c.token,
            now=now,
            attempt=outcome(c, AttemptStatus.FAILED_PERMANENT, now),
            delivery_status=DeliveryStatus.FAILED,
            error="refused",
            job_status=JobStatus.DEAD,
        ),
        Finish(
            delivery_id=d.delivery.id,
            job_id=d.job.id,
            token=d.token,
            now=now,
            attempt=outcome(d, AttemptStatus.FAILED_TRANSIENT, now),
            delivery_status=DeliveryStatus.PENDING,
            error="refused",
            job_status=JobStatus.RETRY_SCHEDULED,
            delay=5.0,
        ),
    ]


async def rows(store: PostgresStore) -> dict[str, list[dict[str, Any]]]:
    out = {}
    async with store.driver.cursor(transaction=False) as cur:
        for table in ("kirim_deliveries", "kirim_jobs", "kirim_attempts", "kirim_message_ids"):
            order = "delivery_id, message_id" if table == "kirim_message_ids" else "id"
            await cur.execute(f"SELECT * FROM {table} ORDER BY {order}")
            out[table] = [dict(r) for r in await cur.fetchall()]
    return out


async def test_a_claim_of_fresh_deliveries_is_one_statement(
    store: PostgresStore, sent: list[str]
) -> None:
    """Due jobs whose deliveries are pending with no attempt are claimed by one statement
    (``claim_fresh``, tests/contract/test_fresh_claim.py checks what it writes), after
    the transaction's settings (``no_jit``, ``plan_by_index``) in the same round trip."""
    await store.enqueue([numbered(i) for i in range(3)], now=1000.0)
    sent.clear()
    claims = await store.claim(worker_id="w1", now=1000.0, lease=LEASE, limit=3)
    assert sent == ["no_jit", "plan_by_index", "claim_fresh"]
    assert [c.delivery.event_id for c in claims] == ["e0", "e1", "e2"]


async def test_a_fresh_claim_skips_the_jobs_another_claim_holds(
    store: PostgresStore, database_url: str
) -> None:
    """Two claims at once take different jobs: the second skips the jobs the first
    holds (its transaction still open) and never waits for them; they are claimable
    again once the first rolls back."""
    await store.enqueue([numbered(i) for i in range(4)], now=1000.0)
    args = {"now": 1000.0, "limit": 2, "lease": LEASE, "worker_id": "w1", "checked_types": []}
    async with await psycopg.AsyncConnection.connect(database_url) as first:
        await first.execute(Q["plan_by_index"])
        held = await (await first.execute(Q["claim_fresh"], args)).fetchall()
        assert len(held) == 2
        claims = await store.claim(worker_id="w2", now=1000.0, lease=LEASE, limit=4)
        assert [c.delivery.event_id for c in claims] == ["e2", "e3"]
        await first.rollback()
    again = await store.claim(worker_id="w2", now=1000.0, lease=LEASE, limit=4)
    assert [c.delivery.event_id for c in again] == ["e0", "e1"]


async def test_the_careful_claim_follows_for_what_the_fresh_claim_passed_over(
    store: PostgresStore, sent: list[str]
) -> None:
    """A delivery with an earlier attempt among the due jobs: ``claim_fresh`` claims the
    fresh one, the careful claim (its locks, its history) the retried one, in the same
    transaction."""
    [first] = await claimed(store, 1, 1000.0)
    assert [r.committed for r in await store.finish([refused(first, run_at=5.0)])] == [True]
    await store.enqueue([numbered(1, run_at=10.0)], now=1002.0)
    sent.clear()
    claims = await store.claim(worker_id="w2", now=1003.0, lease=LEASE, limit=2)
    assert sent[:5] == ["no_jit", "plan_by_index", "claim_fresh", "due_jobs", "claim_history"]
    assert [(c.delivery.event_id, c.prior_requests) for c in claims] == [("e0", 1), ("e1", 0)]


async def test_a_plain_batch_finishes_in_one_statement(
    store: PostgresStore, sent: list[str]
) -> None:
    """A batch of plain finishes whose claims hold is one statement, with no lock taken
    before it and no explicit transaction (the JIT's setting, ``no_jit``, goes in the
    same round trip and implicit transaction)."""
    claims = await claimed(store, 4, 1000.0)
    sent.clear()
    results = await store.finish(plain(claims, 1001.0))
    assert sent == ["no_jit", "finish_fenced"]
    assert [(r.committed, r.delivery_status, r.job_status) for r in results] == [
        (True, DeliveryStatus.SENT, JobStatus.COMPLETED),
        (True, DeliveryStatus.SENT, JobStatus.COMPLETED),
        (True, DeliveryStatus.FAILED, JobStatus.DEAD),
        (True, DeliveryStatus.PENDING, JobStatus.RETRY_SCHEDULED),
    ]


async def test_the_fenced_finish_writes_what_the_careful_one_writes(
    request: pytest.FixtureRequest, store: PostgresStore
) -> None:
    """The same batch finished by the fenced statement and by the careful transaction
    leaves the same rows (the request ids, which name the random tokens, aside)."""
    from pg import fresh_database

    careful = PostgresStore(fresh_database(request))
    await careful.open()
    try:
        await careful.migrate()
        careful.careful_only = True  # the careful way alone
        for s in (store, careful):
            claims = await claimed(s, 4, 1000.0)
            await s.finish(plain(claims, 1001.0))
        assert _strip(await rows(store)) == _strip(await rows(careful))
    finally:
        await careful.close()


def _strip(tables: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    return {
        table: [{k: v for k, v in r.items() if k != "provider_request_id"} for r in found]
        for table, found in tables.items()
    }


async def test_a_finish_whose_lease_was_lost_writes_nothing(
    database_url: str, clock: ManualClock
) -> None:
    """A stands before its commit past its lease; B reaps, claims and sends; A's finish
    (its request refused: a retry) writes no delivery nor job, only its own request's
    outcome."""
    from kirim.channels import Channel
    from kirim.config import Config
    from kirim.engine import Kirim

    provider = FlakyProvider(script=["transient"])
    settings = WorkerSettings(lease=LEASE, backoff_base=1.0, backoff_max=1.0)

    async def app() -> Kirim:
        channels = {"push": Channel(name="push", provider=provider)}
        kirim = Kirim(Config(database=database_url), channels=channels, clock=clock)
        return await kirim.open(migrate=True)

    a, b = await app(), await app()
    try:
        cp = Checkpoints()
        wa = a.worker(settings=settings, worker_id="A", checkpoints=cp)
        wb = b.worker(settings=settings, worker_id="B", checkpoints=cp)
        n = await a.notify("e1", "u1", "push", {"title": "hi"})
        pause = cp.pause("before_commit", worker_id="A")
        task_a = asyncio.create_task(wa.run_once())
        await pause.reached()
        clock.advance(LEASE + 1)
        await wb.run_once()  # B reaps A's lease, claims the delivery again and sends it
        assert isinstance(a.store, PostgresStore)
        before = await rows(a.store)
        assert [d["status"] for d in before["kirim_deliveries"]] == ["sent"]
        pause.release()
        await task_a
        after = await rows(a.store)
        assert after["kirim_deliveries"] == before["kirim_deliveries"]
        assert after["kirim_jobs"] == before["kirim_jobs"]
        changed = [r for r in after["kirim_attempts"] if r not in before["kirim_attempts"]]
        assert [(r["worker_id"], r["status"]) for r in changed] == [("A", "failed_transient")]
        assert wa.context.stats.stale_rejected == 1
        assert provider.effective(n.idempotency_key) == 1
    finally:
        await a.close()
        await b.close()


async def test_a_takeover_inside_the_statement_aborts_it(
    database_url: str, store: PostgresStore, sent: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delivery is taken over after the statement wrote the job and before it
    reaches the delivery (a transaction holds the delivery's row and commits a new
    claim): the statement aborts, and the careful way finds the claim stale; the job
    the statement had written is as it was."""
    [c] = await claimed(store, 1, 1000.0)
    [job_before] = (await rows(store))["kirim_jobs"]
    finish = refused(c, delay=5.0)
    async with await psycopg.AsyncConnection.connect(database_url) as other:
        await other.execute(
            "UPDATE kirim_deliveries SET claim_token = 'taken', claimed_by = 'B' WHERE id = %s",
            (c.delivery.id,),
        )
        sent.clear()
        raced: list[BaseException] = []
        alone = store.driver.run_alone

        async def watched(op: Any) -> Any:
            try:
                return await alone(op)
            except FenceRaced as exc:
                raced.append(exc)
                raise

        monkeypatch.setattr(store.driver, "run_alone", watched)
        finishing = asyncio.create_task(store.finish([finish]))
        await _waits_for_a_row_lock(other, finishing)
        await other.commit()
    [result] = await finishing
    assert len(raced) == 1  # the statement had written the job, and aborted
    assert not result.committed
    # aborted, then the careful way (planned by index, locking first)
    assert sent[:5] == ["no_jit", "finish_fenced", "no_jit", "plan_by_index", "lock_jobs"]
    found = await rows(store)
    assert found["kirim_jobs"] == [job_before]
    [d] = found["kirim_deliveries"]
    assert (d["status"], d["claim_token"]) == ("processing", "taken")
    [attempt] = found["kirim_attempts"]
    assert attempt["status"] == "failed_transient"  # the request's outcome is a fact


async def _waits_for_a_row_lock(
    conn: psycopg.AsyncConnection[Any], task: asyncio.Task[Any]
) -> None:
    """Until another session waits for a lock that ``conn`` holds (the statement stands
    at the delivery's row), or ``task`` ended (it did not wait: the test fails). Polls
    for the wait itself: no time is assumed."""
    while not task.done():
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE pg_backend_pid() = ANY (pg_blocking_pids(pid))"
        )
        found = await cur.fetchone()
        if found is not None and found[0] > 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the finish never waited for the delivery's row")


async def test_a_callers_transaction_keeps_its_planner_settings(
    store: PostgresStore, database_url: str
) -> None:
    """A careful transition run in the caller's own transaction (``run_in``: an event's
    cancellations with ``connection=``) leaves that transaction's settings as they were;
    in kirim's own transaction it plans by index (``plan_by_index``), which ends with
    the transaction."""
    await store.enqueue([numbered(1), numbered(2)], now=1000.0)
    first, second = sorted((await rows(store))["kirim_deliveries"], key=lambda r: r["id"])
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        assert await store.driver.run_in(conn, transitions.cancel(first["id"], 1001.0))
        assert await (await conn.execute("SHOW enable_seqscan")).fetchone() == ("on",)
        await conn.rollback()
    async with store.driver.cursor(transaction=True) as cur:
        assert await drive(transitions.cancel(second["id"], 1001.0), cur, store.driver.time)
        await cur.execute("SHOW enable_seqscan")
        assert await cur.fetchone() == {"enable_seqscan": "off"}
