"""The forced takeover (``kirim.explore.takeover``) and ``finish_by_claim``
(``kirim.explore.finishes``): a stale finish lands while another worker holds the
claim, on both lanes; the audits judge what it wrote, and a finish that writes over
a lost claim is caught: the careful way and the fenced statements without their token
fences on SQLite, PostgreSQL's one statement without its token fence on the PostgreSQL
lane."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import kirim.store.transitions
from differential import unfence_sqlite
from kirim.explore.command import settings_for
from kirim.explore.finishes import check_finish_by_claim
from kirim.explore.invariants import Ledger
from kirim.explore.scenario import Outcome, run_schedule
from kirim.model import DeliveryStatus
from kirim.store.postgres.driver import Q

#: full seeds whose takeover lands a stale, failed finish while the claimant holds the
#: claim (seed 14: A stalls at delivery 1's finish, C claims it; the unfenced finish is
#: caught at 14, 17, 20, 32, 39, 40 and 41 of seeds 0-59)
RACED = (14, 17, 20)


def full(seed: int, database: str | None = None) -> Outcome:
    """The schedule ``kirim explore --workload full`` plays for ``seed``."""
    return run_schedule(settings_for(seed, "mix", workload="full", database=database))


def ledger(releases: list[dict[str, Any]], outcomes: list[dict[str, Any]]) -> Ledger:
    return Ledger(
        deliveries=[], attempts=[], jobs=[], audit=None, releases=releases, outcomes=outcomes
    )


def move(tx: int, by: str, status: str = "pending") -> dict[str, Any]:
    return {"delivery_id": 1, "claim_token": "t", "claimed_by": by, "status": status, "tx": tx}


def outcome(tx: int, by: str, status: str) -> dict[str, Any]:
    return {
        "delivery_id": 1,
        "provider_request_id": "r1",
        "worker_id": by,
        "status": status,
        "tx": tx,
    }


def test_a_stale_failure_that_moves_the_delivery_is_caught() -> None:
    """A failure of A written in the transaction that ended C's claim is a violation."""
    found = check_finish_by_claim(ledger([move(7, "C")], [outcome(7, "A", "failed_transient")]))
    assert [v.name for v in found] == ["finish_by_claim"]
    assert "ending C's claim" in found[0].detail


def test_what_a_claim_or_a_fact_may_write_is_not() -> None:
    """The holder's own failure, a stale outcome written in a transaction of its own,
    and a stale success (a success outranks a failure: a late one marks the delivery
    sent) are no violation; nor is anything on a database without the audits."""
    fine = ledger(
        [move(7, "A"), move(9, "C", "sent")],
        [
            outcome(7, "A", "failed_permanent"),
            outcome(8, "B", "failed_transient"),
            outcome(9, "A", "succeeded"),
        ],
    )
    assert check_finish_by_claim(fine) == []
    assert check_finish_by_claim(Ledger(deliveries=[], attempts=[], jobs=[], audit=None)) == []


def test_the_takeover_lands_a_stale_finish_on_sqlite() -> None:
    """On SQLite too the stalled worker resumes once another has claimed its delivery,
    and its finish is rejected as stale while the claimant holds the claim."""
    lines = full(RACED[0]).lines
    took = next(i for i, line in enumerate(lines) if "takeover delivery=1 claimed by" in line)
    assert "A resumes its finish" in lines[took]
    assert any("host=A stale_write_rejected delivery=1 " in line for line in lines[took:])


def test_mutation_careful_finish_takes_a_lost_claim_is_caught_on_sqlite(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The careful finish (both lanes', SQLite's only) taking a claim another worker
    now holds for its own lets the stalled worker's failure overwrite the claimant's
    delivery: finish_by_claim fires on SQLite, from its audits numbered by
    ``explore_tx()``."""
    finish_one = kirim.store.transitions._finish_one

    def careless(ledger: Any, it: Any, now: float) -> Any:
        d = ledger.delivery(it.delivery_id)
        if d is not None and d.status is DeliveryStatus.PROCESSING and d.claim_token != it.token:
            ledger._deliveries[d.id] = replace(d, claim_token=it.token)  # as if it held
        return finish_one(ledger, it, now)

    monkeypatch.setattr(kirim.store.transitions, "_finish_one", careless)
    for seed in RACED:
        if any(v.name == "finish_by_claim" for v in full(seed).violations):
            return
    pytest.fail(f"a careful finish over a lost claim was not caught at seeds {RACED}")


def test_mutation_unfenced_finish_is_caught_on_sqlite(monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's fenced finish (its jobs' statement checks both tokens, its deliveries'
    statement the delivery's) with the token fences taken out lets the stalled worker's
    failure overwrite the claimant's delivery: finish_by_claim fires."""
    unfence_sqlite(monkeypatch)
    for seed in RACED:
        if any(v.name == "finish_by_claim" for v in full(seed).violations):
            return
    pytest.fail(f"a fenced finish without its token fence was not caught at seeds {RACED}")


def test_the_takeover_holds_on_postgresql(pg_server: str) -> None:
    """On the PostgreSQL lane the takeover lands A's stale finish while C holds the
    claim: rejected, and every invariant, finish_by_claim among them, holds."""
    done = full(RACED[0], pg_server)
    took = next(i for i, line in enumerate(done.lines) if "takeover delivery=1" in line)
    assert "claimed by C: A resumes its finish" in done.lines[took]
    rejected = [line for line in done.lines[took:] if "stale_write_rejected delivery=1 " in line]
    assert rejected
    assert "host=A" in rejected[0]
    assert done.violations == []


def test_mutation_unfenced_finish_is_caught_on_postgresql(
    pg_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's one-statement finish with its token fence taken out (on the job and
    on the delivery) lets the stalled worker's failure overwrite the claimant's
    delivery: finish_by_claim fires."""
    unfenced = Q["finish_fenced"]
    for fence in ("j.lease_token = u.token", "d.claim_token = u.token"):
        assert fence in unfenced
        unfenced = unfenced.replace(fence, "true")
    monkeypatch.setitem(Q, "finish_fenced", unfenced)
    for seed in RACED:
        if any(v.name == "finish_by_claim" for v in full(seed, pg_server).violations):
            return
    pytest.fail(f"a finish without its token fence was not caught at seeds {RACED}")
