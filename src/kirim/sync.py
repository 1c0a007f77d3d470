"""``SyncKirim``: the API of ``kirim.engine.Kirim`` for code without an event loop.

It runs an async ``Kirim`` on a private event loop, one call at a time; a plain
``psycopg.Connection`` given as ``connection`` is written on as the async enqueue
expects (``_async_view``), in the caller's transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from kirim.config import Config
from kirim.engine import Kirim, Notification, NotifyRequest, SendAfter
from kirim.inbox import FeedAction, FeedCounts, FeedFilter, FeedItem, FeedMark, FeedPage
from kirim.model import (
    Record,
    RecordFilter,
)
from kirim.notify.fanout import EventResult
from kirim.operations import By, Page
from kirim.preferences import Preferences

if TYPE_CHECKING:
    pass

T = TypeVar("T")


class SyncKirim:
    """The same API for code without an event loop."""

    def __init__(self, config: Config | None = None, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self.app = Kirim(config, **kwargs)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)

    def open(self, *, migrate: bool = False) -> SyncKirim:
        self._run(self.app.open(migrate=migrate))
        return self

    def close(self) -> None:
        try:
            self._run(self.app.close())
        finally:
            self._loop.close()

    def __enter__(self) -> SyncKirim:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def notify(
        self,
        event_id: str,
        recipient: str,
        channel: str,
        payload: Any,
        *,
        key: str | None = None,
        send_after: SendAfter = None,
        connection: Any = None,
    ) -> Notification:
        """``Kirim.notify``; ``connection`` is the application's own psycopg connection
        (sync, or async on this object's loop) with its transaction open: the
        notification exists if, and only if, that transaction commits."""
        return self._run(
            self.app.notify(
                event_id,
                recipient,
                channel,
                payload,
                key=key,
                send_after=send_after,
                connection=_async_view(connection),
            )
        )

    def notify_many(
        self, requests: Sequence[NotifyRequest], *, connection: Any = None
    ) -> list[Notification]:
        """``Kirim.notify_many``: many notifications in one transaction (all validated
        first); ``connection`` as for ``notify``."""
        return self._run(self.app.notify_many(requests, connection=_async_view(connection)))

    def notify_event(
        self,
        type: str,
        recipients: Any,
        data: Mapping[str, Any],
        *,
        event_id: str,
        connection: Any = None,
    ) -> EventResult:
        """``Kirim.notify_event``; ``connection`` as for ``notify``."""
        return self._run(
            self.app.notify_event(
                type, recipients, data, event_id=event_id, connection=_async_view(connection)
            )
        )

    def render(
        self, type: str, data: Any, *, locale: str | None = None, channel: str | None = None
    ) -> dict[str, dict[str, Any]]:
        """``Kirim.render``."""
        return self.app.render(type, data, locale=locale, channel=channel)

    def get(self, key_or_id: str | int, *, by: By = "auto") -> Record | None:
        """``Kirim.get``."""
        return self._run(self.app.get(key_or_id, by=by))

    def records(
        self, where: RecordFilter | None = None, *, cursor: int | None = None, limit: int = 50
    ) -> Page:
        """``Kirim.records``."""
        return self._run(self.app.records(where, cursor=cursor, limit=limit))

    def dead_letters(self, *, limit: int = 100) -> list[Record]:
        """``Kirim.dead_letters``."""
        return self._run(self.app.dead_letters(limit=limit))

    def in_doubt(self, *, limit: int = 100) -> list[Record]:
        """``Kirim.in_doubt``."""
        return self._run(self.app.in_doubt(limit=limit))

    def cancel(self, key_or_id: str | int, *, dead_only: bool = False, by: By = "auto") -> Record:
        """``Kirim.cancel``."""
        return self._run(self.app.cancel(key_or_id, dead_only=dead_only, by=by))

    def retry(self, key_or_id: str | int, *, by: By = "auto") -> Record:
        """``Kirim.retry``."""
        return self._run(self.app.retry(key_or_id, by=by))

    def preferences(self, recipient_id: str) -> Preferences | None:
        """``Kirim.preferences``."""
        return self._run(self.app.preferences(recipient_id))

    def set_preferences(self, prefs: Preferences) -> Preferences:
        """``Kirim.set_preferences``."""
        return self._run(self.app.set_preferences(prefs))

    def delete_preferences(self, recipient_id: str) -> bool:
        """``Kirim.delete_preferences``."""
        return self._run(self.app.delete_preferences(recipient_id))

    # -- the in-app inbox (``kirim.feeds``) ------------------------------------------

    def feed(
        self,
        recipient_id: str,
        *,
        filter: FeedFilter | str = FeedFilter.INBOX,
        limit: int = 50,
        before: int | None = None,
    ) -> FeedPage:
        """``Kirim.feed``."""
        return self._run(self.app.feed(recipient_id, filter=filter, limit=limit, before=before))

    def feed_counts(self, recipient_id: str) -> FeedCounts:
        """``Kirim.feed_counts``."""
        return self._run(self.app.feed_counts(recipient_id))

    def feed_action(self, recipient_id: str, item_id: int, action: FeedAction | str) -> FeedItem:
        """``Kirim.feed_action``."""
        return self._run(self.app.feed_action(recipient_id, item_id, action))

    def mark_feed(
        self, recipient_id: str, state: FeedMark | str, ids: Sequence[int] | None = None
    ) -> int:
        """``Kirim.mark_feed``."""
        return self._run(self.app.mark_feed(recipient_id, state, ids))

    def delete_feed_item(self, recipient_id: str, item_id: int) -> None:
        """``Kirim.delete_feed_item``."""
        self._run(self.app.delete_feed_item(recipient_id, item_id))

    def feed_token(self, recipient_id: str, *, ttl: float = 3600.0) -> tuple[str, float]:
        """``Kirim.feed_token`` (no database: a signature)."""
        return self.app.feed_token(recipient_id, ttl=ttl)


def _async_view(connection: Any) -> Any:
    """A sync ``psycopg.Connection`` as the async connection ``enqueue_in`` writes on
    (its statements run in the caller's transaction, blocking, as sync code expects);
    anything else as it is."""
    if connection is None:
        return None
    try:
        import psycopg
    except ImportError:  # then it is no psycopg connection
        return connection
    return _SyncConnection(connection) if isinstance(connection, psycopg.Connection) else connection


class _SyncConnection:
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    @contextlib.asynccontextmanager
    async def cursor(self, **kwargs: Any) -> AsyncIterator[_SyncCursor]:
        with self._conn.cursor(**kwargs) as cur:
            yield _SyncCursor(cur)


class _SyncCursor:
    def __init__(self, cur: Any) -> None:
        self._cur = cur

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> None:
        self._cur.execute(query, params, **kwargs)

    async def fetchall(self) -> Any:
        return self._cur.fetchall()

    async def fetchone(self) -> Any:
        return self._cur.fetchone()

    @property
    def rowcount(self) -> int:
        return int(self._cur.rowcount)

    @property
    def description(self) -> Any:
        return self._cur.description
