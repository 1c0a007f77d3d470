"""What only PostgreSQL does for the in-app inbox: every feed write (a new message in
the worker's finish, a mark, a delete) says pg_notify('kirim_feed', recipient_id) in
its own transaction, so a process that LISTENs hears of it at the commit; a write
that changed nothing says nothing."""

from __future__ import annotations

import psycopg
import pytest

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.providers.inbox import InboxProvider
from kirim.testing import ManualClock
from kirim.worker import WorkerSettings
from pg import fresh_database


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty PostgreSQL database (skipped, or failed in CI, without a server)."""
    return fresh_database(request)


def heard(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    """The kirim_feed notifications delivered so far (a bounded wait for the first)."""
    return [n.payload for n in conn.notifies(timeout=1.0) if n.channel == "kirim_feed"]


async def test_feed_writes_notify_listeners_at_commit(pg_url: str) -> None:
    """A listener hears the recipient's id for the new message, for a read, for mark
    all read and for a delete; nothing for a read that was already read."""
    clock = ManualClock()
    channels = {"inbox": Channel(name="inbox", provider=InboxProvider())}
    app = Kirim(Config(database=pg_url), channels=channels, clock=clock)
    await app.open(migrate=True)
    listener = psycopg.connect(pg_url, autocommit=True)
    try:
        listener.execute("LISTEN kirim_feed")
        await app.notify("e-1", "user/7", "inbox", {"title": "hi"})
        await app.notify("e-2", "user/7", "inbox", {"title": "again"})
        worker = app.worker(settings=WorkerSettings(lease=30.0))
        while await worker.run_once():
            pass
        assert set(heard(listener)) == {"user/7"}
        [newer, older] = (await app.feed("user/7")).items
        await app.feed_action("user/7", older.id, "read")
        assert heard(listener) == ["user/7"]
        await app.feed_action("user/7", older.id, "read")  # no change: no notification
        assert heard(listener) == []
        await app.mark_feed("user/7", "read")
        assert heard(listener) == ["user/7"]
        await app.delete_feed_item("user/7", newer.id)
        assert heard(listener) == ["user/7"]
    finally:
        listener.close()
        await app.close()
