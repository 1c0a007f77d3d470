"""The claim of fresh deliveries (``claim_fresh``, both backends): a due job whose
delivery is pending, has no attempt and is of no type whose preferences the claim
checks is claimed with no row read into Python first. What it writes and returns is
what the careful claim writes and returns, and the careful claim takes the due jobs it
passed over, in the same transaction."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from backends import BACKENDS, backend_url
from kirim.model import AttemptStatus, DeliveryStatus, JobStatus
from kirim.preferences import TypePolicy
from kirim.store import open_store, transitions
from kirim.store.base import AttemptOutcome, Claim, ClaimKind, Finish, Intent
from kirim.store.sql import SQLStore
from notify_kit import numbered

LEASE = 10.0
#: a type whose preferences a claim given POLICIES checks: its deliveries are not fresh
CHECKED = "shipped"
POLICIES = {CHECKED: TypePolicy(name=CHECKED)}


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SQLStore]:
    s = open_store(backend_url(request, tmp_path))
    await s.open()
    await s.migrate()
    yield s
    await s.close()


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The events of the deliveries ``claim_fresh`` claimed from now on."""
    claimed: list[str] = []
    inner = transitions._fresh

    def watched(*args: Any) -> Any:
        claims = yield from inner(*args)
        claimed.extend(c.delivery.event_id for c in claims)
        return claims

    monkeypatch.setattr(transitions, "_fresh", watched)
    return claimed


async def test_a_fresh_claim_is_the_rows_as_written(store: SQLStore, fresh: list[str]) -> None:
    """Fresh deliveries claimed by ``claim_fresh``: in due order, each the delivery and
    job as written, under one new token each, leased as long as claimed."""
    await store.enqueue([numbered(i, run_at=float(3 - i)) for i in range(3)], now=1000.0)
    claims = await store.claim(worker_id="w1", now=1000.0, lease=LEASE, limit=3)
    assert [c.delivery.event_id for c in claims] == ["e2", "e1", "e0"]  # by run_at
    assert fresh == ["e2", "e1", "e0"]
    for c in claims:
        assert c.kind is ClaimKind.CLAIMED
        assert c.delivery == await store.get_delivery(str(c.delivery.id), by="id")
        assert c.job == await store.get_job(c.delivery.id)
        assert (c.delivery.status, c.job.status) == (DeliveryStatus.PROCESSING, JobStatus.RUNNING)
        assert c.token == c.delivery.claim_token == c.job.lease_token
        assert len(c.token) == 32
        assert int(c.token, 16) >= 0
        assert (c.delivery.claimed_by, c.job.lease_owner, c.job.attempts) == ("w1", "w1", 1)
        assert c.delivery.claim_expires_at == c.job.lease_expires_at == 1000.0 + LEASE
        assert (c.now, c.delivery.updated_at, c.job.updated_at) == (1000.0,) * 3
        assert (c.prior_requests, c.doubtful, c.history, c.withheld) == (0, (), (), None)
    assert len({c.token for c in claims}) == 3


def _named_apart(c: Claim) -> dict[str, Any]:
    """A claim's values but those that name its delivery, its job or its claim (and
    the delivery's type)."""
    names = {"id", "delivery_id", "idempotency_key", "event_id", "recipient", "payload"}
    names |= {"payload_hash", "recipient_id", "claim_token", "lease_token", "run_at", "type"}
    out = {k: v for k, v in asdict(c).items() if k not in ("job", "delivery", "token")}
    for part in ("job", "delivery"):
        out[part] = {k: v for k, v in asdict(getattr(c, part)).items() if k not in names}
    return out


async def test_the_fresh_claim_writes_what_the_careful_claim_writes(
    store: SQLStore, fresh: list[str]
) -> None:
    """Two deliveries alike but for their type: the one whose type's preferences are
    checked is claimed the careful way (no preference stored: it goes), the other by
    ``claim_fresh``; the claims and the rows written are the same."""
    await store.enqueue(
        [numbered(0, type=CHECKED), numbered(1, run_at=1.0, type="other")], now=1000.0
    )
    [careful] = await store.claim(
        worker_id="w1", now=1000.0, lease=LEASE, limit=1, policies=POLICIES
    )
    [quick] = await store.claim(worker_id="w1", now=1000.0, lease=LEASE, limit=1)
    assert (careful.delivery.event_id, quick.delivery.event_id) == ("e0", "e1")
    assert fresh == ["e1"]
    assert _named_apart(careful) == _named_apart(quick)
    for c in (careful, quick):  # as written
        assert c.delivery == await store.get_delivery(str(c.delivery.id), by="id")
        assert c.job == await store.get_job(c.delivery.id)


async def test_the_careful_claim_takes_what_the_fresh_claim_passed_over(
    store: SQLStore, fresh: list[str]
) -> None:
    """Among the first due jobs, a delivery with an earlier attempt (a retry) and one
    whose type's preferences are checked are not fresh: the careful claim takes them in
    the same transaction, with their history, and the claims come in due order."""
    await store.enqueue([numbered(0)], now=1000.0)
    [first] = await store.claim(worker_id="w1", now=1000.0, lease=LEASE, limit=1)
    request_id = "req-0"
    intent = Intent(
        delivery_id=first.delivery.id,
        job_id=first.job.id,
        token=first.token,
        number=1,
        provider_request_id=request_id,
        worker_id="w1",
        requested_at=1000.0,
    )
    assert await store.record_intents([intent]) == [True]
    refused = AttemptOutcome(
        provider_request_id=request_id,
        status=AttemptStatus.FAILED_TRANSIENT,
        provider_message_id=None,
        error="refused",
        completed_at=1001.0,
    )
    retry = Finish(
        delivery_id=first.delivery.id,
        job_id=first.job.id,
        token=first.token,
        now=1001.0,
        attempt=refused,
        delivery_status=DeliveryStatus.PENDING,
        error="refused",
        job_status=JobStatus.RETRY_SCHEDULED,
        run_at=5.0,
    )
    assert [r.committed for r in await store.finish([retry])] == [True]
    await store.enqueue(
        [
            numbered(1, run_at=10.0),
            numbered(2, run_at=20.0, type=CHECKED),
            numbered(3, run_at=30.0),
        ],
        now=1002.0,
    )
    claims = await store.claim(worker_id="w2", now=1003.0, lease=LEASE, limit=3, policies=POLICIES)
    assert [c.delivery.event_id for c in claims] == ["e0", "e1", "e2"]  # due order
    assert fresh == ["e0", "e1"]  # the first claim's, and this one's fresh delivery
    assert [c.kind for c in claims] == [ClaimKind.CLAIMED] * 3
    assert [(c.prior_requests, len(c.history), c.job.attempts) for c in claims] == [
        (1, 1, 2),
        (0, 0, 1),
        (0, 0, 1),
    ]
    for c in claims:
        assert c.delivery == await store.get_delivery(str(c.delivery.id), by="id")
        assert c.job == await store.get_job(c.delivery.id)
    left = await store.get_job((await store.get_delivery("key-3", by="key")).id)
    assert left is not None
    assert left.status is JobStatus.QUEUED
