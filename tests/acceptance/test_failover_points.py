"""The primary dies at the worst points of one delivery, and the standby takes over.

A worker in this process, on a multi-host URL (``target_session_attrs=read-write``),
is paused at a checkpoint; the test SIGKILLs the primary and promotes the standby,
then lets the worker go on: it reconnects to the new primary and finishes.

- Synchronous standby: the intent (and the claim) the worker committed are on the
  standby, so whatever the point, the request leaves once and the ledger knows it.
- Asynchronous standby, WAL held back (the primary's walsender frozen with SIGSTOP,
  as a slow link would): the commits the primary acknowledged are lost with it. kirim
  cannot prevent that, but the worker notices (``ledger_behind``: an intent it had
  committed is gone), and when the claim went too, another worker sends again.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator

import psycopg
import pytest

from kirim.channels import Channel
from kirim.config import Config
from kirim.doctor.checks import diagnose
from kirim.doctor.probes import Database
from kirim.engine import Kirim
from kirim.model import AttemptStatus, DeliveryStatus
from kirim.testing import Checkpoints, FlakyProvider
from kirim.worker import WorkerSettings
from kirim.worker.delivery import RECHECK_AFTER
from pgcluster import Cluster, Replication, cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

SETTINGS = WorkerSettings(lease=20.0, poll_interval=0.1)


async def _app(url: str, provider: FlakyProvider) -> Kirim:
    app = Kirim(
        Config(database=url, max_attempts=3),
        channels={"push": Channel(name="push", provider=provider)},
    )
    return await app.open(migrate=True)


@pytest.fixture
async def apps(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[Cluster, list[Kirim], FlakyProvider]]:
    replication: Replication = request.param
    made = cluster(request, replication)
    url = made.create_database("kirim")
    provider = FlakyProvider(idempotent=False)
    opened = [await _app(url, provider), await _app(url, provider)]
    made.wait_replayed()  # the schema is on the standby too
    try:
        yield made, opened, provider
    finally:
        for app in opened:
            await app.close()


def _fail_over(made: Cluster) -> None:
    made.kill_primary()
    made.promote()


@pytest.mark.parametrize("apps", ["sync"], indirect=True)
@pytest.mark.parametrize("point", ["before_provider_request", "after_provider_response"])
async def test_sync_failover_at_the_worst_points(apps, point: str) -> None:
    """The primary dies after the intent's commit (before the request leaves), or after
    the answer (before the finish): the request leaves once, the delivery ends sent on
    the new primary with its attempt, and no commit was lost."""
    made, (app, _), provider = apps
    n = await app.notify("order-1", "u-1", "push", {"title": "shipped"})
    made.wait_replayed()
    checkpoints = Checkpoints()
    pause = checkpoints.pause(point)
    worker = app.worker(settings=SETTINGS, worker_id="A", checkpoints=checkpoints)
    running = asyncio.create_task(worker.run_once())
    await pause.reached(30)
    await asyncio.to_thread(_fail_over, made)
    pause.release()
    await asyncio.wait_for(running, 60)
    record = await app.get(n.delivery_id)
    delivery, attempts = record.delivery, record.attempts
    assert provider.received(n.idempotency_key) == 1
    assert delivery.status is DeliveryStatus.SENT
    assert [a.status for a in attempts] == [AttemptStatus.SUCCEEDED]
    assert app.store.ledger.missing == []  # type: ignore[attr-defined]


def _freeze_streaming(made: Cluster) -> int:
    """SIGSTOP the primary's walsender: what the primary commits from now on stays there."""
    made.wait_replayed()
    pid = made.walsender()
    os.kill(pid, signal.SIGSTOP)
    return pid


@pytest.mark.parametrize("apps", ["async"], indirect=True)
async def test_async_failover_loses_an_intent_and_the_worker_says_so(apps) -> None:
    """The claim reached the standby, the intent did not: after the failover the request
    has left (once: the claim still holds), the ledger has no attempt for it, and the
    worker logs ledger_behind and notes it for `kirim doctor`."""
    made, (app, _), provider = apps
    n = await app.notify("order-1", "u-1", "push", {"title": "shipped"})
    checkpoints = Checkpoints()
    claimed = checkpoints.pause("after_claim")
    sending = checkpoints.pause("before_provider_request")
    worker = app.worker(settings=SETTINGS, worker_id="A", checkpoints=checkpoints)
    running = asyncio.create_task(worker.run_once())
    await claimed.reached(30)
    await asyncio.to_thread(_freeze_streaming, made)  # the claim is on the standby
    claimed.release()
    await sending.reached(30)  # the intent is committed, on the primary only
    await asyncio.to_thread(_fail_over, made)
    sending.release()
    await asyncio.wait_for(running, 60)
    record = await app.get(n.delivery_id)
    delivery, attempts = record.delivery, record.attempts
    assert provider.received(n.idempotency_key) == 1
    assert delivery.status is DeliveryStatus.SENT  # the claim held: its finish went through
    assert attempts == []  # the ledger forgot the request
    [request_id] = app.store.ledger.missing  # type: ignore[attr-defined]
    with psycopg.connect(made.url("kirim"), autocommit=True) as conn:
        notes = conn.execute(
            "SELECT value FROM kirim_meta WHERE key LIKE 'ledger_behind:%'"
        ).fetchall()
    assert [json.loads(v)["provider_request_ids"] for (v,) in notes] == [[request_id]]
    with Database(made.url("kirim")) as db:
        found = {c.name: c for c in diagnose(db, app.config, now=0.0)}
    assert found["ledger_behind"].status == "problem"
    assert request_id in found["ledger_behind"].message


@pytest.mark.parametrize("apps", ["async"], indirect=True)
async def test_async_failover_that_loses_the_claim_sends_twice(apps) -> None:
    """The claim and the intent stayed on the dead primary, and A's request had left
    (A is paused after the answer): the new primary has the delivery pending with no
    attempt, so another worker claims and sends it again (the duplicate asynchronous
    replication costs), and A reports ledger_behind."""
    made, (a, b), provider = apps
    n = await a.notify("order-1", "u-1", "push", {"title": "shipped"})
    await asyncio.to_thread(_freeze_streaming, made)
    checkpoints = Checkpoints()
    answered = checkpoints.pause("after_provider_response")
    first = a.worker(settings=SETTINGS, worker_id="A", checkpoints=checkpoints)
    running = asyncio.create_task(first.run_once())
    await answered.reached(30)
    assert provider.received(n.idempotency_key) == 1
    await asyncio.to_thread(_fail_over, made)
    await b.worker(settings=SETTINGS, worker_id="B").run_once()  # the job is queued again
    assert provider.received(n.idempotency_key) == 2
    answered.release()  # A's finish: its claim is gone from the new primary
    await asyncio.wait_for(running, 60)
    assert provider.received(n.idempotency_key) == 2
    assert len(a.store.ledger.missing) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("apps", ["async"], indirect=True)
async def test_async_failover_before_the_request_sends_once(apps) -> None:
    """The same loss with A paused before its request: after a pause that long A renews
    its claim before anything leaves, finds it gone (B has claimed and sent the
    delivery on the new primary), and sends nothing: one copy, not two."""
    made, (a, b), provider = apps
    n = await a.notify("order-1", "u-1", "push", {"title": "shipped"})
    await asyncio.to_thread(_freeze_streaming, made)
    checkpoints = Checkpoints()
    sending = checkpoints.pause("before_provider_request")
    first = a.worker(settings=SETTINGS, worker_id="A", checkpoints=checkpoints)
    running = asyncio.create_task(first.run_once())
    await sending.reached(30)
    await asyncio.to_thread(_fail_over, made)
    await b.worker(settings=SETTINGS, worker_id="B").run_once()  # the job is queued again
    assert provider.received(n.idempotency_key) == 1
    await asyncio.sleep(RECHECK_AFTER)  # the pause outlasts it for certain (so does a failover)
    sending.release()
    await asyncio.wait_for(running, 60)
    assert provider.received(n.idempotency_key) == 1
    delivery = (await b.get(n.delivery_id)).delivery
    assert delivery.status is DeliveryStatus.SENT
