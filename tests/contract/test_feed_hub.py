"""``kirim.live.FeedHub`` on both backends: streams of one recipient that read at the
same number before a new wake-up share one read of the store; a wake-up after it makes
the next read a new one (so a change committed meanwhile is seen)."""

from __future__ import annotations

import asyncio
from typing import Any

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.live import FeedHub
from kirim.providers.inbox import InboxProvider
from kirim.worker import WorkerSettings


async def test_streams_at_one_number_share_one_read(database_url: str) -> None:
    """Fifty reads at one number are one read of the store; after a wake-up (a message
    written) the next is a read of its own, and finds the message."""
    channels = {"inbox": Channel(name="inbox", provider=InboxProvider())}
    app = Kirim(Config(database=database_url), channels=channels)
    await app.open(migrate=True)
    hub = FeedHub(app)
    reads = 0
    real = app.store.feed_changes

    async def counted(*args: Any) -> Any:
        nonlocal reads
        reads += 1
        return await real(*args)

    app.store.feed_changes = counted  # type: ignore[method-assign]
    try:
        async with hub.subscribe("u1") as woke:
            batches = await asyncio.gather(*(hub.read("u1", 0) for _ in range(50)))
            assert reads == 1
            assert all(b.changes == [] for b in batches)
            await app.notify("e-1", "u1", "inbox", {"title": "hi"})
            worker = app.worker(settings=WorkerSettings(lease=30.0))
            while await worker.run_once():
                pass
            assert woke.is_set()  # on_feed_change, after the worker's commit
            again = await asyncio.gather(*(hub.read("u1", 0) for _ in range(50)))
            assert reads == 2
            assert [c.kind for c in again[0].changes] == ["message"]
    finally:
        await hub.close()
        await app.close()
