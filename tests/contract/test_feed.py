"""The in-app inbox on both backends: an inbox delivery writes its message into the
recipient's feed in the commit that marks it sent, exactly once per key (a second
send of the key, a worker crash before the commit, a late commit after a takeover);
the feed pages newest first with its filters and counts; marks are idempotent and
timestamped, one by one and in bulk; a message is deleted; another recipient's
message is out of reach; every change is told to ``on_feed_change``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.errors import NotFound
from kirim.inbox import FeedAction
from kirim.model import DeliveryStatus
from kirim.notify.types import parse_type
from kirim.preferences import Preferences, Window
from kirim.providers.inbox import InboxProvider
from kirim.testing import Checkpoints, ManualClock
from kirim.validation import BadValue
from kirim.worker import WorkerSettings

LEASE = 30.0
SETTINGS = WorkerSettings(lease=LEASE, backoff_base=1.0, backoff_max=1.0)
SHIPPED = parse_type(
    "shipped",
    {
        "templates": {
            "inbox": {
                "title": "Order {{ n }} shipped",
                "body": "It is on its way.",
                "action_url": "https://app.example/orders/{{ n }}",
                "data": '{"order": "{{ n }}"}',
            }
        }
    },
)


@pytest.fixture
async def app(database_url: str, clock: ManualClock) -> AsyncIterator[Kirim]:
    channels = {"inbox": Channel(name="inbox", provider=InboxProvider())}
    kirim = Kirim(Config(database=database_url), channels=channels, clock=clock, types=[SHIPPED])
    await kirim.open(migrate=True)
    yield kirim
    await kirim.close()


async def drain(app: Kirim, **kw: object) -> None:
    worker = app.worker(settings=SETTINGS, **kw)  # type: ignore[arg-type]
    while await worker.run_once():
        pass


async def stalled_before_commit(app: Kirim, clock: ManualClock) -> tuple[Any, asyncio.Task[int]]:
    """Worker A paused before the commit that would write its message, its lease over
    (the pause, to release; A's task, to await)."""
    cp = Checkpoints()
    late = cp.pause("before_commit", worker_id="A")
    task = asyncio.create_task(
        app.worker(settings=SETTINGS, worker_id="A", checkpoints=cp).run_once()
    )
    await late.reached()
    clock.advance(LEASE + 1)
    return late, task


async def test_an_event_is_rendered_into_the_feed_once(app: Kirim, clock: ManualClock) -> None:
    """An event's inbox message lands in the recipient's feed with its rendered parts;
    the same event again writes nothing more, and the worker's commit tells the hook."""
    told: list[tuple[str, str, int]] = []
    app.on_feed_change.append(lambda *change: told.append(change))
    await app.notify_event("shipped", ["u1"], {"n": "48291"}, event_id="o-1")
    await drain(app)
    await app.notify_event("shipped", ["u1"], {"n": "48291"}, event_id="o-1")
    await drain(app)
    page = await app.feed("u1")
    assert len(page.items) == 1
    item = page.items[0]
    assert (item.type, item.title, item.body) == (
        "shipped",
        "Order 48291 shipped",
        "It is on its way.",
    )
    assert item.action_url == "https://app.example/orders/48291"
    assert item.data == {"order": "48291"}
    assert item.created_at == clock.now()
    assert (item.seen_at, item.read_at, item.archived_at) == (None, None, None)
    assert page.counts.to_json() == {"unseen": 1, "unread": 1}
    assert page.next_before is None
    assert told == [("u1", "new", item.id)]
    assert (await app.feed("u2")).items == []
    shown = item.to_json()
    assert shown["created_at"].endswith("Z")
    assert shown["seen_at"] is None


async def test_a_crash_before_the_commit_writes_nothing_and_the_retry_writes_once(
    app: Kirim, clock: ManualClock
) -> None:
    """A worker that dies after rendering, before its commit, left no message; the
    retry after its lease writes it, once, and the delivery is sent, not in doubt."""
    n = await app.notify("e-1", "u1", "inbox", {"title": "Hello", "body": "there"})
    cp = Checkpoints()
    crash = cp.pause("before_commit", worker_id="A")
    crash.crash()
    await app.worker(settings=SETTINGS, worker_id="A", checkpoints=cp).run_once()
    assert (await crash.reached())["worker_id"] == "A"
    assert (await app.feed("u1")).items == []
    clock.advance(LEASE + 1)
    await drain(app, worker_id="B")
    delivery = (await app.get(n.delivery_id)).delivery
    assert delivery.status is DeliveryStatus.SENT
    assert delivery.doubt is None
    items = (await app.feed("u1")).items
    assert [(i.title, i.idempotency_key) for i in items] == [("Hello", n.idempotency_key)]


async def test_a_late_commit_after_a_takeover_leaves_one_message(
    app: Kirim, clock: ManualClock
) -> None:
    """Worker A stalls before its commit, B takes the delivery over and writes the
    message; A's late commit writes no second one (its claim was lost: an in-commit
    channel's message exists only by a commit under a holding claim)."""
    n = await app.notify("e-2", "u1", "inbox", {"body": "once"})
    late, task = await stalled_before_commit(app, clock)
    await drain(app, worker_id="B")
    late.release()
    await task
    items = (await app.feed("u1")).items
    assert [i.body for i in items] == ["once"]
    delivery = (await app.get(n.delivery_id)).delivery
    assert delivery.status is DeliveryStatus.SENT


async def _three(app: Kirim) -> list[int]:
    for i in range(3):
        await app.notify(f"m-{i}", "u1", "inbox", {"title": f"m{i}"})
    await app.notify("other", "u2", "inbox", {"title": "theirs"})
    await drain(app)
    return [i.id for i in (await app.feed("u1")).items]


async def test_pages_go_newest_first_with_a_cursor_and_filters(app: Kirim) -> None:
    """Pages list newest first; next_before pages on to the end; archived messages show
    only with filter=archived (or all), unseen and unread keep those without the mark."""
    newest, middle, oldest = await _three(app)
    assert newest > middle > oldest
    first = await app.feed("u1", limit=2)
    assert [i.id for i in first.items] == [newest, middle]
    assert first.next_before == middle
    rest = await app.feed("u1", limit=2, before=first.next_before)
    assert [i.id for i in rest.items] == [oldest]
    assert rest.next_before is None
    await app.feed_action("u1", oldest, "archive")
    await app.feed_action("u1", middle, "read")
    await app.feed_action("u1", newest, "seen")
    assert [i.id for i in (await app.feed("u1")).items] == [newest, middle]
    assert [i.id for i in (await app.feed("u1", filter="archived")).items] == [oldest]
    assert [i.id for i in (await app.feed("u1", filter="all")).items] == [newest, middle, oldest]
    assert [i.id for i in (await app.feed("u1", filter="unseen")).items] == []
    assert [i.id for i in (await app.feed("u1", filter="unread")).items] == [newest]
    assert (await app.feed_counts("u1")).to_json() == {"unseen": 0, "unread": 1}
    with pytest.raises(BadValue):
        await app.feed("u1", filter="nope")
    with pytest.raises(BadValue):
        await app.feed("u1", limit=0)


async def test_marks_keep_their_first_time_and_can_be_cleared(
    app: Kirim, clock: ManualClock
) -> None:
    """read sets read and seen; a second read keeps the first times; unread clears
    read only; archive and unarchive likewise; only real changes reach the hook."""
    newest, _, _ = await _three(app)
    told: list[tuple[str, str, int]] = []
    app.on_feed_change.append(lambda *change: told.append(change))
    first = await app.feed_action("u1", newest, FeedAction.READ)
    assert first.read_at == first.seen_at == clock.now()
    clock.advance(10)
    again = await app.feed_action("u1", newest, "read")
    assert (again.read_at, again.seen_at) == (first.read_at, first.seen_at)
    unread = await app.feed_action("u1", newest, "unread")
    assert unread.read_at is None
    assert unread.seen_at == first.seen_at
    archived = await app.feed_action("u1", newest, "archive")
    assert archived.archived_at == clock.now()
    back = await app.feed_action("u1", newest, "unarchive")
    assert back.archived_at is None
    assert told == [("u1", "state", newest)] * 4


async def test_mark_all_read_and_some_archived(app: Kirim, clock: ManualClock) -> None:
    """mark_feed with no ids marks every one of the recipient's messages (and no one
    else's), counting only those that changed; with ids, only those."""
    newest, middle, oldest = await _three(app)
    await app.feed_action("u1", middle, "read")
    assert await app.mark_feed("u1", "read") == 2
    assert await app.mark_feed("u1", "read") == 0
    assert (await app.feed_counts("u1")).to_json() == {"unseen": 0, "unread": 0}
    assert (await app.feed_counts("u2")).to_json() == {"unseen": 1, "unread": 1}
    assert await app.mark_feed("u1", "archived", [oldest, newest, 999_999]) == 2
    assert [i.id for i in (await app.feed("u1")).items] == [middle]
    with pytest.raises(BadValue):
        await app.mark_feed("u1", "unread")


async def test_another_recipients_message_is_out_of_reach_and_delete_removes(
    app: Kirim,
) -> None:
    """An action or delete on another recipient's message, or an unknown id, is
    NotFound and changes nothing; delete removes one's own for good."""
    newest, _, _ = await _three(app)
    [theirs] = (await app.feed("u2")).items
    for item_id in (theirs.id, 999_999, 0, 2**70):
        with pytest.raises(NotFound):
            await app.feed_action("u1", item_id, "read")
        with pytest.raises(NotFound):
            await app.delete_feed_item("u1", item_id)
    assert (await app.feed("u2")).items[0].read_at is None
    await app.delete_feed_item("u1", newest)
    assert newest not in [i.id for i in (await app.feed("u1", filter="all")).items]
    with pytest.raises(NotFound):
        await app.delete_feed_item("u1", newest)


async def test_a_deleted_message_stays_gone_after_a_late_commit(
    app: Kirim, clock: ManualClock
) -> None:
    """Worker A stalls before its commit, B writes the message, the recipient deletes
    it; A's late commit of the same delivery does not bring it back (the deleted row
    keeps its key)."""
    await app.notify("e-3", "u1", "inbox", {"body": "bye"})
    late, task = await stalled_before_commit(app, clock)
    await drain(app, worker_id="B")
    [item] = (await app.feed("u1")).items
    await app.delete_feed_item("u1", item.id)
    late.release()
    await task
    assert (await app.feed("u1", filter="all")).items == []
    assert (await app.feed_counts("u1")).to_json() == {"unseen": 0, "unread": 0}


async def test_quiet_hours_defer_the_message_to_the_window(app: Kirim, clock: ManualClock) -> None:
    """A message that comes in the recipient's quiet hours is not in the feed before
    they end (the worker finds nothing due); it appears at the window, once."""
    # ManualClock starts at 08:00 UTC: quiet from 07:00 to 10:00
    quiet = Preferences(recipient_id="u1", timezone="UTC", quiet_hours=Window.parse("07:00-10:00"))
    await app.set_preferences(quiet)
    await app.notify_event("shipped", ["u1"], {"n": "7"}, event_id="o-quiet")
    await drain(app)
    assert (await app.feed("u1")).items == []
    clock.advance(2 * 3600 - 60)  # 09:59
    await drain(app)
    assert (await app.feed("u1")).items == []
    clock.advance(120)  # 10:01
    await drain(app)
    [item] = (await app.feed("u1")).items
    assert item.title == "Order 7 shipped"
    assert item.created_at >= 1_800_000_000.0 + 2 * 3600


async def test_a_final_attempt_that_never_committed_is_failed_not_in_doubt(
    database_url: str, clock: ManualClock
) -> None:
    """On its last attempt a worker dies after its intent, before its commit: the
    reaper ends the inbox delivery failed (the feed has no message: nothing is in doubt
    where the message and the outcome share one commit), where a webhook's would be
    held in doubt."""
    channels = {"inbox": Channel(name="inbox", provider=InboxProvider())}
    app = Kirim(Config(database=database_url, max_attempts=1), channels=channels, clock=clock)
    await app.open(migrate=True)
    try:
        n = await app.notify("e-last", "u1", "inbox", {"body": "last"})
        cp = Checkpoints()
        crash = cp.pause("before_commit", worker_id="A")
        crash.crash()
        await app.worker(settings=SETTINGS, worker_id="A", checkpoints=cp).run_once()
        await crash.reached()
        clock.advance(LEASE + 1)
        reaper = app.worker(settings=SETTINGS, worker_id="B")
        await reaper._reaper.reap()
        record = await app.get(n.delivery_id)
        delivery, attempts = record.delivery, record.attempts
        assert [a.status.value for a in attempts] == ["requested"]
        assert delivery.status is DeliveryStatus.FAILED
        assert delivery.doubt is None
        assert (await app.feed("u1")).items == []
    finally:
        await app.close()


def test_sync_kirim_reads_and_marks_the_feed(database_url: str, clock: ManualClock) -> None:
    """SyncKirim offers the feed's verbs to code that is not async."""
    from kirim.sync import SyncKirim

    channels = {"inbox": Channel(name="inbox", provider=InboxProvider())}
    with SyncKirim(Config(database=database_url), channels=channels, clock=clock).open(
        migrate=True
    ) as app:
        app.notify("e-sync", "u1", "inbox", "plain text")
        worker = app.app.worker(settings=SETTINGS)
        while app._run(worker.run_once()):
            pass
        [item] = app.feed("u1").items
        assert item.body == "plain text"
        assert app.feed_action("u1", item.id, "seen").seen_at == clock.now()
        assert app.mark_feed("u1", "read") == 1
        assert app.feed_counts("u1").to_json() == {"unseen": 0, "unread": 0}
        app.delete_feed_item("u1", item.id)
        assert app.feed("u1", filter="all").items == []


async def test_a_commit_that_never_came_leaves_no_doubt_about_an_inbox_message(
    app: Kirim, clock: ManualClock
) -> None:
    """Worker A stalls before the commit that would write the message; its lease ends
    and the recipient opts out. The next claim has nothing in doubt: A's request was
    never written (a commit whose claim no longer holds writes none), so the delivery
    is suppressed, A's request recorded as not written, not assumed sent nor held for
    an operator with an empty feed; A's late commit changes nothing."""
    await app.notify_event("shipped", ["u1"], {"n": "7"}, event_id="o-stall")
    late, task = await stalled_before_commit(app, clock)
    await app.set_preferences(Preferences(recipient_id="u1", opt_out=True))
    await drain(app, worker_id="B")
    record = (await app.records()).records[0]
    assert record.delivery.status is DeliveryStatus.SUPPRESSED, record.delivery
    assert record.delivery.doubt is None
    [stalled] = record.attempts
    assert stalled.status.value == "failed_transient"
    assert "not written" in (stalled.error or "")
    late.release()
    await task
    after = (await app.get(record.delivery.id)).delivery
    assert after.status is DeliveryStatus.SUPPRESSED
    assert (await app.feed("u1", filter="all")).items == []
