"""``LISTEN kirim_feed``: the feed writes of every process, for live updates
(``kirim.live``).

Each feed write says ``pg_notify('kirim_feed', recipient_id)`` in its transaction
(the feed's statements, and the trigger of ``0011_feed_changes.sql``); PostgreSQL
delivers it at the commit to every listening connection, on any host.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import psycopg

CHANNEL = "kirim_feed"


async def listen_for_feeds(
    conninfo: str,
    *,
    on_notify: Callable[[str], None],
    on_lost: Callable[[], None],
    reconnect: float,
) -> None:
    """Call ``on_notify(recipient_id)`` for every notification, until cancelled. A new
    or lost connection calls ``on_lost()``: what was said while none listened is
    unknown, so every stream should read."""
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        except psycopg.Error:
            await asyncio.sleep(reconnect)
            continue
        try:
            await conn.execute(f"LISTEN {CHANNEL}")
            on_lost()
            async for note in conn.notifies():
                on_notify(note.payload)
        except psycopg.Error:
            pass
        finally:
            with contextlib.suppress(Exception):
                await conn.close()
        on_lost()
        await asyncio.sleep(reconnect)
