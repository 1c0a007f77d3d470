"""A throw-away PostgreSQL database for a benchmark: ``fresh_postgres(url, name)`` drops
and makes ``name`` on ``url``'s server and returns its URL (``fresh_ledger``: migrated
too); ``enqueue_plain`` fills a store's queue with plain notifications."""

from __future__ import annotations

from typing import Any


async def fresh_postgres(url: str, name: str) -> str:
    """A new database ``name`` beside ``url``'s, dropped and made again."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(f"DROP DATABASE IF EXISTS {name}")
        await conn.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name


async def fresh_ledger(url: str, name: str) -> str:
    """``fresh_postgres``, with kirim's schema migrated."""
    from kirim.store.postgres import PostgresStore

    db = await fresh_postgres(url, name)
    store = PostgresStore(db)
    await store.open()
    try:
        await store.migrate()
    finally:
        await store.close()
    return db


async def enqueue_plain(store: Any, notifications: int, *, now: float = 1000.0) -> None:
    """Enqueue ``notifications`` plain deliveries (due at once, no type) on ``store``,
    1,000 per call."""
    from kirim.keys import canonical_json, payload_hash
    from kirim.store.base import NewDelivery

    text = canonical_json({"title": "hi"})
    items = [
        NewDelivery(
            idempotency_key=f"k{i}",
            event_id=f"e{i}",
            recipient=f"u{i}",
            channel="push",
            payload_json=text,
            payload_hash=payload_hash(text),
            run_at=0.0,
            max_attempts=3,
        )
        for i in range(notifications)
    ]
    for i in range(0, notifications, 1000):
        await store.enqueue(items[i : i + 1000], now=now)
