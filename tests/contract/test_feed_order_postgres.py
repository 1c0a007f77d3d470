"""What only PostgreSQL needs for the feed's change numbers (``0011_feed_changes``):
one recipient's numbers follow its commits. A transaction that has numbered a write
holds the recipient's lock to its commit, so a second writer of the same recipient
waits for it (seen in ``pg_locks``, not by a sleep) and draws the next number after
it; a writer of another recipient does not wait."""

from __future__ import annotations

import threading

import psycopg
import pytest

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.providers.inbox import InboxProvider
from kirim.worker import WorkerSettings
from pg import fresh_database

#: a bound on every wait: only a broken lock reaches it
BOUND = 20.0


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty PostgreSQL database (skipped, or failed in CI, without a server)."""
    return fresh_database(request)


async def _feeds(pg_url: str) -> dict[str, list[int]]:
    """Two messages for u1, one for u2: their ids by recipient."""
    channels = {"inbox": Channel(name="inbox", provider=InboxProvider())}
    app = Kirim(Config(database=pg_url), channels=channels)
    await app.open(migrate=True)
    try:
        for key, rid in (("a", "u1"), ("b", "u1"), ("c", "u2")):
            await app.notify(key, rid, "inbox", {"title": key})
        worker = app.worker(settings=WorkerSettings(lease=30.0))
        while await worker.run_once():
            pass
        return {rid: [i.id for i in (await app.feed(rid)).items] for rid in ("u1", "u2")}
    finally:
        await app.close()


def _waiting_for_a_lock(watch: psycopg.Connection[tuple[object, ...]], pid: int) -> bool:
    row = watch.execute(
        "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", (pid,)
    ).fetchone()
    return bool(row and row[0])


async def test_a_second_writer_of_the_recipient_waits_for_the_first_commit(
    pg_url: str,
) -> None:
    """While one transaction holds a numbered write of u1, another write of u1 waits
    for its commit and gets the larger number; a write of u2 goes through at once."""
    ids = await _feeds(pg_url)
    first = psycopg.connect(pg_url)
    second = psycopg.connect(pg_url, autocommit=True)
    watch = psycopg.connect(pg_url, autocommit=True)
    try:
        first.execute("UPDATE kirim_feed SET read_at = 1 WHERE id = %s", (ids["u1"][0],))
        row = first.execute(
            "SELECT changed_seq FROM kirim_feed WHERE id = %s", (ids["u1"][0],)
        ).fetchone()
        assert row is not None
        drawn_first = int(str(row[0]))
        # another recipient's write does not wait
        second.execute("UPDATE kirim_feed SET read_at = 1 WHERE id = %s", (ids["u2"][0],))
        pid = second.info.backend_pid
        done = threading.Event()

        def write() -> None:
            second.execute("UPDATE kirim_feed SET read_at = 1 WHERE id = %s", (ids["u1"][1],))
            done.set()

        thread = threading.Thread(target=write)
        thread.start()
        # wait, bounded, until the second writer is seen waiting on a lock
        deadline_polls = int(BOUND / 0.05)
        for _ in range(deadline_polls):
            if _waiting_for_a_lock(watch, pid):
                break
            done.wait(0.05)
        assert _waiting_for_a_lock(watch, pid), "the second writer of u1 did not wait"
        assert not done.is_set()
        first.commit()
        thread.join(BOUND)
        assert done.is_set()
        seqs = dict(
            watch.execute(
                "SELECT id, changed_seq FROM kirim_feed WHERE id = ANY(%s)", (ids["u1"],)
            ).fetchall()
        )
        assert int(str(seqs[ids["u1"][1]])) > drawn_first
    finally:
        first.close()
        second.close()
        watch.close()
