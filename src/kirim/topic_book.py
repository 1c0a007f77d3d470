"""The engine's verbs on topics (``kirim.topics``, docs/topics.md): what the library,
``kirim topics`` and ``/v1/topics`` call.

``notify_topic`` is a verb of its own rather than a ``topic=`` argument of
``notify_event``: ``notify_event`` records every delivery in the caller's
transaction and returns them, while a topic event returns at once with its mark and
its deliveries are made later, batch by batch, by the workers; one call with two
such different answers would be harder to use rightly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kirim.errors import InvalidNotification
from kirim.notify import fanout
from kirim.preferences import check_recipient_id
from kirim.store.event_writes import TopicBatch
from kirim.topics import Subscription, TopicCounts, TopicEvent, TopicInfo, check_topic
from kirim.validation import BadValue
from kirim.workflows import plan_runs

if TYPE_CHECKING:
    from kirim.clock import Clock
    from kirim.config import Config
    from kirim.store.base import Store
    from kirim.store.event_writes import CancelBy
    from kirim.store.flows import NewRun


class TopicBook:
    """Mixed into ``Kirim``: its store, clock and the event intake."""

    if TYPE_CHECKING:
        config: Config
        store: Store
        clock: Clock

        def prepare_event(
            self, type: str, recipients: Any, data: Mapping[str, Any], *, event_id: str
        ) -> fanout.Event: ...

        def address_channels(self) -> frozenset[str]: ...

        def _cancels_of(self, event: str, data: Mapping[str, Any]) -> list[CancelBy]: ...

    async def subscribe(self, topic: str, recipient_id: str) -> Subscription:
        """Subscribe the recipient to the topic (``created`` False: it was already).
        Events to the topic recorded after this returns reach the recipient; BadValue
        for a topic or recipient id kirim cannot store."""
        return await self.store.subscribe(
            check_topic(topic), check_recipient_id(recipient_id), now=self.clock.now()
        )

    async def unsubscribe(self, topic: str, recipient_id: str) -> bool:
        """End the recipient's subscription (False: it had none). A fan-out of an event
        recorded before this still reaches the recipient."""
        return await self.store.unsubscribe(
            check_topic(topic), check_recipient_id(recipient_id), now=self.clock.now()
        )

    async def topics_of(self, recipient_id: str) -> list[str]:
        """The topics the recipient is subscribed to."""
        return await self.store.topics_of(check_recipient_id(recipient_id))

    async def subscribers(
        self, topic: str, *, after: str | None = None, limit: int = 100
    ) -> list[str]:
        """A page of the topic's subscribers, by id after ``after``."""
        return await self.store.subscribers(check_topic(topic), after=after, limit=limit)

    async def list_topics(self, *, limit: int = 100) -> list[TopicInfo]:
        """Topics by name, each with its subscriber count."""
        return await self.store.list_topics(limit=limit)

    async def topic_info(self, topic: str, *, recent: int = 10) -> TopicInfo | None:
        """The topic, its subscriber count and its ``recent`` latest events (None:
        nobody ever subscribed or sent to it)."""
        return await self.store.topic_info(check_topic(topic), recent=recent)

    async def latest_topic_events(self, *, limit: int = 20) -> list[TopicEvent]:
        """The latest events of every topic, newest first, each with its fan-out's
        progress."""
        return await self.store.latest_topic_events(limit=limit)

    async def topic_counts(self) -> TopicCounts:
        """How many topics and live subscriptions, and how many topic events are
        pending (no batch yet), expanding and done."""
        return await self.store.topic_counts()

    async def notify_topic(
        self, type: str, topic: str, data: Mapping[str, Any], *, event_id: str
    ) -> TopicEvent:
        """An event of a notification type to everyone subscribed to ``topic`` when it
        commits (its mark). Returns the topic event recorded; the workers make its
        deliveries, batch by batch, as ``notify_event`` would for each subscriber
        (preferences, addresses, throttles and digests apply; keys
        ``default_key(event_id, recipient, channel)``). The same type, event id and
        topic again return the event recorded first (``created`` False) and add
        nothing. The data and templates are checked first, rendered for one
        placeholder recipient: ``InvalidNotification`` (``RenderError``) and nothing
        is written. A workflow type's event (one with ``steps``) fans out into one run
        per subscriber instead (``run_key(type, event_id, recipient_id)``, as
        ``notify_event``'s). The event cancels what ``notify_event``'s would (a type's
        ``cancel_on``), in its own transaction."""
        try:
            name = check_topic(topic)
        except BadValue as exc:
            raise InvalidNotification(str(exc)) from None
        event = await asyncio.to_thread(
            self.prepare_event, type, [f"topic:{name}"], data, event_id=event_id
        )
        return await self.store.record_topic_event(
            name,
            event.type.name,
            event.event_id,
            event.data_json,
            now=self.clock.now(),
            cancels=self._cancels_of(event.type.name, event.data),
        )

    async def plan_topic_batch(self, event: TopicEvent, recipients: Sequence[str]) -> TopicBatch:
        """The deliveries of one batch of a topic event's subscribers, planned as
        ``notify_event`` plans them (nothing written), or for a workflow type its runs,
        one per subscriber (``plan_runs``): the worker's fan-out
        (``kirim.worker.topics``) records them with the batch."""

        def prepare() -> tuple[fanout.Event, list[NewRun] | None]:
            prepared = self.prepare_event(
                event.type,
                list(recipients),
                json.loads(event.data_json),
                event_id=event.event_id,
            )
            if not prepared.type.steps:
                return prepared, None
            return prepared, plan_runs(prepared, self.config.max_attempts)

        # a batch's rendering (and its runs' messages), off the worker's loop
        prepared, runs = await asyncio.to_thread(prepare)
        if runs is not None:
            return TopicBatch(runs=runs)
        prefs = await self.store.preferences_of(prepared.recipient_ids)
        addresses = await self.store.addresses_of(prepared.recipient_ids)
        planned = fanout.plan(
            prepared,
            prefs,
            now=self.clock.now(),
            max_attempts=self.config.max_attempts,
            addresses=addresses,
            needs_address=self.address_channels(),
        )
        return TopicBatch(deliveries=[p.delivery for p in planned])
