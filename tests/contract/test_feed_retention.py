"""Retention of the in-app inbox on both backends: a feed message goes ``keep`` after
it came, an archived (or deleted) one ``archived`` after it was archived, never while
its delivery has an attempt that may still land (none can write it again: a commit
whose claim no longer holds writes no message); the prune report (and its dry run)
counts them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.providers.inbox import InboxProvider
from kirim.testing import Checkpoints, ManualClock
from kirim.worker import WorkerSettings

DAY = 86_400.0
KEEP, ARCHIVED, KEYS = 30 * DAY, 7 * DAY, 365 * DAY
SETTINGS = WorkerSettings(lease=30.0)


@pytest.fixture
async def app(database_url: str, clock: ManualClock) -> AsyncIterator[Kirim]:
    channels = {"inbox": Channel(name="inbox", provider=InboxProvider())}
    kirim = Kirim(Config(database=database_url), channels=channels, clock=clock)
    await kirim.open(migrate=True)
    yield kirim
    await kirim.close()


async def drain(app: Kirim) -> None:
    worker = app.worker(settings=SETTINGS)
    while await worker.run_once():
        pass


async def prune(app: Kirim, *, dry_run: bool = False, archived: float = ARCHIVED) -> int:
    done = await app.store.prune(
        now=app.clock.now(), keep=KEEP, keys=KEYS, archived=archived, dry_run=dry_run
    )
    assert done.as_dict()["feed_items"] == done.feed_items
    return done.feed_items


async def ids(app: Kirim) -> list[int]:
    return [i.id for i in (await app.feed("u1", filter="all")).items]


async def test_archived_go_after_their_keep_the_others_after_keep(
    app: Kirim, clock: ManualClock
) -> None:
    """Of three messages, the archived one goes ARCHIVED after its archiving, the
    deleted one likewise, the plain one only KEEP after it came; a dry run counts
    first and deletes nothing."""
    for i in range(3):
        await app.notify(f"e-{i}", "u1", "inbox", {"title": f"t{i}"})
    await drain(app)
    plain, archived, deleted = sorted(await ids(app))
    await app.feed_action("u1", archived, "archive")
    await app.delete_feed_item("u1", deleted)
    clock.advance(ARCHIVED - 1)
    assert await prune(app) == 0
    clock.advance(2)
    assert await prune(app, dry_run=True) == 2
    assert sorted(await ids(app)) == [plain, archived]
    assert await prune(app) == 2
    assert await ids(app) == [plain]
    clock.advance(KEEP)
    assert await prune(app) == 1
    assert await ids(app) == []


async def test_a_late_commit_after_its_message_was_pruned_writes_it_no_second_time(
    app: Kirim, clock: ManualClock
) -> None:
    """A stalled worker's commit may come after its attempt settled (a process paused
    for longer than the settle margin), and after prune took the message another worker
    wrote: an in-commit channel's message exists only by a commit under a holding claim,
    so the stale one writes none (it wrote a second message to the user, explorer seed
    50928, full workload, random policy). The worker that took over recorded the stalled
    request as not written (its commit never came: no doubt), so prune no longer waits
    for it to settle (before, it kept the message while that request was open: the late
    commit had to find the key taken)."""
    await app.notify("e-9", "u1", "inbox", {"title": "late"})
    cp = Checkpoints()
    late = cp.pause("before_commit", worker_id="A")
    task = asyncio.create_task(
        app.worker(settings=SETTINGS, worker_id="A", checkpoints=cp).run_once()
    )
    await late.reached()
    clock.advance(31)
    await drain(app)
    [first] = await ids(app)
    record = await app.get(1)
    assert record is not None
    settled = max(a.settles_at or 0.0 for a in record.attempts)
    assert all(a.completed_at is not None for a in record.attempts)  # none left open
    clock.advance(max(settled - clock.now(), 0.0) + KEEP + 1)
    assert await prune(app) == 1
    assert await ids(app) == []
    late.release()
    await task
    assert await ids(app) == [], f"the late commit wrote it again (first was {first})"
    after = await app.get(1)
    assert after is not None
    assert after.delivery.status.value == "sent"  # by the worker that took over
    [stale] = [a for a in after.attempts if a.worker_id == "A"]
    assert stale.status.value == "failed_transient"
    assert "not written" in (stale.error or "")
