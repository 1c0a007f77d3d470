"""The engine on PostgreSQL: notify() inside the application's transaction, and an idle
worker woken by LISTEN/NOTIFY instead of its next poll."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from kirim.channels import Channel
from kirim.clock import SystemClock
from kirim.config import Config
from kirim.engine import Kirim, NotifyRequest
from kirim.errors import ConfigError, IdempotencyKeyReused
from kirim.providers.base import Message
from kirim.testing import FlakyProvider
from kirim.worker import WorkerSettings
from pg import fresh_database


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> str:
    return fresh_database(request)


async def open_app(url: str, provider: FlakyProvider | None = None) -> Kirim:
    channel = Channel(name="push", provider=provider or FlakyProvider())
    app = Kirim(Config(database=url), channels={"push": channel}, clock=SystemClock())
    await app.open(migrate=True)
    return app


async def test_notify_commits_with_the_business_write(pg_url: str) -> None:
    """A notification written on the caller's connection exists iff its transaction commits."""
    app = await open_app(pg_url)
    try:
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            await conn.execute("CREATE TABLE orders (id int primary key)")
            await conn.commit()
            async with conn.transaction():
                await conn.execute("INSERT INTO orders VALUES (1)")
                kept = await app.notify("order-1", "u1", "push", {"o": 1}, connection=conn)
            with pytest.raises(RuntimeError, match="business rule"):  # noqa: PT012
                async with conn.transaction():
                    await conn.execute("INSERT INTO orders VALUES (2)")
                    await app.notify("order-2", "u2", "push", {"o": 2}, connection=conn)
                    raise RuntimeError("business rule says no")
        assert kept.created
        assert await app.store.get_delivery(kept.idempotency_key) is not None
        counts = await app.store.counts()
        assert counts["deliveries"] == {"pending": 1}
        assert counts["jobs"] == {"queued": 1}
    finally:
        await app.close()


async def test_a_reused_key_is_raised_inside_the_callers_transaction(pg_url: str) -> None:
    """On the caller's connection the reused key is raised before the caller commits:
    its transaction block rolls back, with the other notification of the batch."""
    app = await open_app(pg_url)
    try:
        await app.notify("order-1", "u1", "push", {"o": 1}, key="k-1")
        batch = [
            NotifyRequest(event_id="order-2", recipient="u2", channel="push", payload={}),
            NotifyRequest(
                event_id="order-1", recipient="u1", channel="push", payload={}, key="k-1"
            ),
        ]
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            with pytest.raises(IdempotencyKeyReused, match="different payload"):
                async with conn.transaction():
                    await app.notify_many(batch, connection=conn)
        assert (await app.store.counts())["deliveries"] == {"pending": 1}
    finally:
        await app.close()


async def test_transactional_notify_needs_postgres(tmp_path) -> None:
    """On SQLite, notify(connection=...) is refused with a clear message."""
    channel = Channel(name="push", provider=FlakyProvider())
    app = Kirim(Config(database=f"sqlite:///{tmp_path / 'k.db'}"), channels={"push": channel})
    await app.open(migrate=True)
    try:
        with pytest.raises(ConfigError, match="PostgreSQL"):
            await app.notify("e", "u", "push", {}, connection=object())
    finally:
        await app.close()


async def test_idle_worker_wakes_on_notify_not_on_its_poll(pg_url: str) -> None:
    """With a 60 s poll interval, a new notification is still sent at once (LISTEN/NOTIFY)."""
    arrived = asyncio.Event()

    async def seen(_: Message) -> None:
        arrived.set()

    provider = FlakyProvider(on_request=seen)
    app = await open_app(pg_url, provider)
    producer = await open_app(pg_url)
    worker = app.worker(settings=WorkerSettings(lease=30, poll_interval=60), worker_id="A")
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.waiting.wait(), 10)  # idle, listening
        await producer.notify("e", "u", "push", {})
        await asyncio.wait_for(arrived.wait(), 10)  # far below the 60 s poll
    finally:
        worker.stop()
        await running
        await producer.close()
        await app.close()
    assert provider.requests
