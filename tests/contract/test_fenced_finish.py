"""SQLite's plain finish by fenced statements (``transitions.finish_fenced_first``: the
jobs, whose statement checks both tokens, the deliveries and the attempts, one run per
item, all of them or the transaction undone, then the careful way for the rest, in the
finish's one transaction; issue 24): the same answers, rows and reads as the careful
way on random call sequences, and statements without their token fence are caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from differential import first_difference, unfence_sqlite
from kirim.model import AttemptStatus, DeliveryStatus, JobStatus
from kirim.store import transitions
from kirim.store.base import AttemptOutcome, Claim, Finish
from kirim.store.sqlite import SQLiteStore
from notify_kit import intent_of, numbered


def _pair(tmp_path: Path, seed: int) -> tuple[SQLiteStore, SQLiteStore]:
    """The careful way (the reference) and the fenced statements, on two files."""
    careful = SQLiteStore(f"sqlite:///{tmp_path / f'careful-{seed}.db'}")
    careful.careful_only = True
    return careful, SQLiteStore(f"sqlite:///{tmp_path / f'fenced-{seed}.db'}")


@pytest.mark.parametrize("seed", range(8))
async def test_the_same_answers_as_the_careful_way(tmp_path: Path, seed: int) -> None:
    """Random call sequences (stale tokens, doubts, successes of other attempts, the
    same delivery twice in a batch) give the same results, rows and reads."""
    assert await first_difference(_pair(tmp_path, seed), seed) is None


async def test_mutation_unfenced_finish_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fenced statements with their token fences taken out (they write a finish
    whose claim was lost) differ from the careful way within 200 seeds."""
    unfence_sqlite(monkeypatch)
    for seed in range(200):
        where = await first_difference(_pair(tmp_path, seed), seed)
        if where is not None:
            assert "finish" in where, where
            return
    pytest.fail("a finish without its token fence was not caught within 200 seeds")


async def test_a_mixed_batch_is_one_transaction(tmp_path: Path) -> None:
    """A batch of plain finishes and one the careful way decides (a doubt decision) is
    one transaction: the fenced statements, then the careful way's reads and writes."""
    store = SQLiteStore(f"sqlite:///{tmp_path / 'k.db'}")
    await store.open()
    try:
        await store.migrate()
        await store.enqueue([numbered(i) for i in range(3)], now=1000.0)
        claims = await store.claim(worker_id="w", now=1000.0, lease=10.0, limit=3)
        assert await store.record_intents([intent_of(c, f"req-{c.delivery.id}") for c in claims])
        finishes = [_finish(c, DeliveryStatus.SENT) for c in claims[:2]]
        finishes.append(_finish(claims[2], DeliveryStatus.IN_DOUBT))
        assert [transitions.fenceable(f) for f in finishes] == [True, True, False]
        seen: list[str] = []
        conn = store.driver._conn
        assert conn is not None
        await store.driver._call(lambda: conn.set_trace_callback(seen.append))
        results = await store.finish(finishes)
        await store.driver._call(lambda: conn.set_trace_callback(None))
        assert [r.committed for r in results] == [True, True, True]
        assert [r.delivery_status for r in results] == [
            DeliveryStatus.SENT, DeliveryStatus.SENT, DeliveryStatus.IN_DOUBT,
        ]  # fmt: skip
        words = [s.split()[0] for s in seen]
        assert (words.count("BEGIN"), words.count("COMMIT")) == (1, 1)
        fenced = next(i for i, s in enumerate(seen) if s.startswith("UPDATE kirim_jobs"))
        read = next(i for i, s in enumerate(seen) if s.startswith("SELECT * FROM kirim_jobs"))
        assert fenced < read  # the fenced statements first, then the careful way's reads
    finally:
        await store.close()


def _finish(c: Claim, status: DeliveryStatus) -> Finish:
    ok = status is DeliveryStatus.SENT
    return Finish(
        delivery_id=c.delivery.id,
        job_id=c.job.id,
        token=c.token,
        now=1001.0,
        attempt=AttemptOutcome(
            provider_request_id=f"req-{c.delivery.id}",
            status=AttemptStatus.SUCCEEDED if ok else AttemptStatus.UNKNOWN,
            provider_message_id="pm" if ok else None,
            error=None,
            completed_at=1001.0,
        ),
        delivery_status=status,
        provider_message_id="pm" if ok else None,
        job_status=JobStatus.COMPLETED if ok else JobStatus.DEAD,
    )
