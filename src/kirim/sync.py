"""``SyncKirim``: the whole API of ``kirim.engine.Kirim`` for code without an event loop.

It runs an async ``Kirim`` on a private event loop, one call at a time; every public
method of ``Kirim`` has its blocking twin here (a test keeps the two lists the same),
except the HTTP service's own steps (``handle_requests``, ``give_back_request``),
which only ``kirim serve`` takes. A plain ``psycopg.Connection`` given as
``connection`` is written on as the async intake expects
(``kirim.sync_connection``), in the caller's transaction. ``worker()`` gives a
``SyncWorker`` that runs on the same loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from kirim.addresses import Address
from kirim.callbacks import CallbackAuth
from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim, Notification, NotifyRequest, SendAfter
from kirim.inbox import FeedAction, FeedCounts, FeedFilter, FeedItem, FeedMark, FeedPage
from kirim.model import CallbackStatus, Record, RecordFilter
from kirim.notify import fanout
from kirim.notify.fanout import EventResult
from kirim.notify.types import NotificationType
from kirim.observe.metrics import Metrics
from kirim.operations import By, Page
from kirim.preferences import Preferences
from kirim.runs import Run
from kirim.store.base import ActivityBucket, CallbackResult, NewDelivery
from kirim.store.flows import Canceled
from kirim.sync_connection import async_view
from kirim.topics import Subscription, TopicCounts, TopicEvent, TopicInfo
from kirim.worker import Worker, WorkerSettings
from kirim.worker.checkpoint import Checkpoint
from kirim.worker.stats import WorkerStats

T = TypeVar("T")

#: ``Kirim``'s public methods that ``SyncKirim`` does not offer, and why
NOT_OFFERED = {
    "handle_requests": "a step of the HTTP service's intake (kirim serve)",
    "give_back_request": "a step of the HTTP service's intake (kirim serve)",
    "feed_changed": "the hook a commit calls to tell Kirim.on_feed_change's listeners",
    "plan_topic_batch": "a step of the worker's topic fan-out (kirim.worker.topics)",
}


class SyncKirim:
    """The same API for code without an event loop."""

    def __init__(self, config: Config | None = None, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self.app = Kirim(config, **kwargs)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)

    @property
    def config(self) -> Config:
        return self.app.config

    def open(self, *, migrate: bool = False) -> SyncKirim:
        """``Kirim.open`` (``migrate``: bring the schema up to date first)."""
        self._run(self.app.open(migrate=migrate))
        return self

    def close(self) -> None:
        """``Kirim.close``, then this object's loop."""
        try:
            self._run(self.app.close())
        finally:
            self._loop.close()

    def __enter__(self) -> SyncKirim:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- recording notifications ---------------------------------------------------------

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
                connection=async_view(connection),
            )
        )

    def notify_many(
        self, requests: Sequence[NotifyRequest], *, connection: Any = None
    ) -> list[Notification]:
        """``Kirim.notify_many``: many notifications in one transaction (all validated
        first); ``connection`` as for ``notify``."""
        return self._run(self.app.notify_many(requests, connection=async_view(connection)))

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
                type, recipients, data, event_id=event_id, connection=async_view(connection)
            )
        )

    def prepare_event(
        self, type: str, recipients: Any, data: Mapping[str, Any], *, event_id: str
    ) -> fanout.Event:
        """``Kirim.prepare_event``."""
        return self.app.prepare_event(type, recipients, data, event_id=event_id)

    def record_event(
        self,
        event: fanout.Event,
        *,
        connection: Any = None,
        request: tuple[str, str] | None = None,
        respond: Callable[[EventResult], tuple[int, str]] | None = None,
        fingerprint: str | None = None,
    ) -> EventResult:
        """``Kirim.record_event``; ``connection`` as for ``notify``."""
        return self._run(
            self.app.record_event(
                event,
                connection=async_view(connection),
                request=request,
                respond=respond,
                fingerprint=fingerprint,
            )
        )

    def prepare(self, request: NotifyRequest, *, now: float | None = None) -> NewDelivery:
        """``Kirim.prepare``."""
        return self.app.prepare(request, now=now)

    def render(
        self, type: str, data: Any, *, locale: str | None = None, channel: str | None = None
    ) -> dict[str, dict[str, Any]]:
        """``Kirim.render``."""
        return self.app.render(type, data, locale=locale, channel=channel)

    def notification_type(self, name: str) -> NotificationType:
        """``Kirim.notification_type``."""
        return self.app.notification_type(name)

    # -- channels --------------------------------------------------------------------------

    @property
    def channel_names(self) -> set[str]:
        return self.app.channel_names

    def channels(self) -> dict[str, Channel]:
        """``Kirim.channels``."""
        return self.app.channels()

    def known_channels(self) -> dict[str, Channel]:
        """``Kirim.known_channels``."""
        return self.app.known_channels()

    def address_channels(self) -> frozenset[str]:
        """``Kirim.address_channels``."""
        return self.app.address_channels()

    def address_kind(self, channel: str) -> str | None:
        """``Kirim.address_kind``."""
        return self.app.address_kind(channel)

    def callback_auth(self, channel: str) -> CallbackAuth | None:
        """``Kirim.callback_auth``."""
        return self.app.callback_auth(channel)

    # -- reading ---------------------------------------------------------------------------

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

    def activity(self, *, since: float, bucket: float = 60.0) -> list[ActivityBucket]:
        """``Kirim.activity``."""
        return self._run(self.app.activity(since=since, bucket=bucket))

    # -- the operator's verbs ----------------------------------------------------------------

    def cancel(self, key_or_id: str | int, *, dead_only: bool = False, by: By = "auto") -> Record:
        """``Kirim.cancel``."""
        return self._run(self.app.cancel(key_or_id, dead_only=dead_only, by=by))

    def retry(self, key_or_id: str | int, *, by: By = "auto") -> Record:
        """``Kirim.retry``."""
        return self._run(self.app.retry(key_or_id, by=by))

    def reconcile(self, key_or_id: str | int, *, by: By = "auto") -> Record:
        """``Kirim.reconcile``."""
        return self._run(self.app.reconcile(key_or_id, by=by))

    def second_copy_possible(self, record: Record) -> bool:
        """``Kirim.second_copy_possible``."""
        return self.app.second_copy_possible(record)

    def confirm(
        self,
        channel: str,
        message_id: str,
        status: CallbackStatus | str,
        *,
        key: str | None = None,
        reason: str | None = None,
        at: float | None = None,
    ) -> CallbackResult:
        """``Kirim.confirm``: a provider's (verified) delivery callback."""
        return self._run(
            self.app.confirm(channel, message_id, status, key=key, reason=reason, at=at)
        )

    # -- recipients ------------------------------------------------------------------------

    def preferences(self, recipient_id: str) -> Preferences | None:
        """``Kirim.preferences``."""
        return self._run(self.app.preferences(recipient_id))

    def set_preferences(self, prefs: Preferences) -> Preferences:
        """``Kirim.set_preferences``."""
        return self._run(self.app.set_preferences(prefs))

    def delete_preferences(self, recipient_id: str) -> bool:
        """``Kirim.delete_preferences``."""
        return self._run(self.app.delete_preferences(recipient_id))

    def addresses(self, recipient_id: str) -> list[Address]:
        """``Kirim.addresses``."""
        return self._run(self.app.addresses(recipient_id))

    # -- topics (``kirim.topic_book``) -----------------------------------------------

    def subscribe(self, topic: str, recipient_id: str) -> Subscription:
        """``Kirim.subscribe``."""
        return self._run(self.app.subscribe(topic, recipient_id))

    def unsubscribe(self, topic: str, recipient_id: str) -> bool:
        """``Kirim.unsubscribe``."""
        return self._run(self.app.unsubscribe(topic, recipient_id))

    def topics_of(self, recipient_id: str) -> list[str]:
        """``Kirim.topics_of``."""
        return self._run(self.app.topics_of(recipient_id))

    def subscribers(self, topic: str, *, after: str | None = None, limit: int = 100) -> list[str]:
        """``Kirim.subscribers``."""
        return self._run(self.app.subscribers(topic, after=after, limit=limit))

    def list_topics(self, *, limit: int = 100) -> list[TopicInfo]:
        """``Kirim.list_topics``."""
        return self._run(self.app.list_topics(limit=limit))

    def topic_info(self, topic: str, *, recent: int = 10) -> TopicInfo | None:
        """``Kirim.topic_info``."""
        return self._run(self.app.topic_info(topic, recent=recent))

    def latest_topic_events(self, *, limit: int = 20) -> list[TopicEvent]:
        """``Kirim.latest_topic_events``."""
        return self._run(self.app.latest_topic_events(limit=limit))

    def topic_counts(self) -> TopicCounts:
        """``Kirim.topic_counts``."""
        return self._run(self.app.topic_counts())

    def notify_topic(
        self, type: str, topic: str, data: Mapping[str, Any], *, event_id: str
    ) -> TopicEvent:
        """``Kirim.notify_topic``."""
        return self._run(self.app.notify_topic(type, topic, data, event_id=event_id))

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

    def cancel_by_event(self, event: str, data: Mapping[str, Any]) -> list[Canceled]:
        """``Kirim.cancel_by_event``."""
        return self._run(self.app.cancel_by_event(event, data))

    def get_run(self, run_id: int) -> Run | None:
        """``Kirim.get_run``."""
        return self._run(self.app.get_run(run_id))

    def must_get_run(self, run_id: int) -> Run:
        """``Kirim.must_get_run``."""
        return self._run(self.app.must_get_run(run_id))

    def cancel_run(self, run_id: int, *, why: str = "canceled by an operator") -> Canceled:
        """``Kirim.cancel_run``."""
        return self._run(self.app.cancel_run(run_id, why=why))

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

    def feed_token_recipient(self, token: str) -> str:
        """``Kirim.feed_token_recipient`` (no database: a signature)."""
        return self.app.feed_token_recipient(token)

    def add_address(
        self, recipient_id: str, channel: str, address: str, *, label: str | None = None
    ) -> Address:
        """``Kirim.add_address``."""
        return self._run(self.app.add_address(recipient_id, channel, address, label=label))

    def remove_address(self, recipient_id: str, channel: str, address: str) -> bool:
        """``Kirim.remove_address``."""
        return self._run(self.app.remove_address(recipient_id, channel, address))

    def retire_address(
        self, channel: str, address: str, *, reason: str = "retired by an operator"
    ) -> int:
        """``Kirim.retire_address``."""
        return self._run(self.app.retire_address(channel, address, reason=reason))

    # -- the worker --------------------------------------------------------------------------

    def worker(
        self,
        *,
        settings: WorkerSettings | None = None,
        worker_id: str | None = None,
        checkpoints: Checkpoint | None = None,
        metrics: Metrics | None = None,
    ) -> SyncWorker:
        """``Kirim.worker``, run on this object's loop (``SyncWorker``)."""
        worker = self.app.worker(
            settings=settings, worker_id=worker_id, checkpoints=checkpoints, metrics=metrics
        )
        return SyncWorker(worker, self._loop)


class SyncWorker:
    """A ``Worker`` for code without an event loop: each call blocks until it is done.
    ``stop`` may be called from another thread (or a signal handler) while ``run``
    blocks."""

    def __init__(self, worker: Worker, loop: asyncio.AbstractEventLoop) -> None:
        self.worker = worker
        self._loop = loop

    def run_once(self) -> int:
        """Reap, claim one batch and send it to the end; how many were claimed."""
        return self._loop.run_until_complete(self.worker.run_once())

    def run(self, *, burst: bool = False) -> WorkerStats:
        """Work until ``stop()`` (or, with ``burst``, until no work is left)."""
        return self._loop.run_until_complete(self.worker.run(burst=burst))

    def stop(self) -> None:
        """Stop claiming, finish what is in flight, release the rest (thread-safe)."""
        self._loop.call_soon_threadsafe(self.worker.stop)
