"""``Kirim``: the application object. ``notify()`` records a delivery and its job.

The async class is the core; ``kirim.sync.SyncKirim`` is a thin wrapper that runs it
on a private event loop, for code that is not async.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast

from kirim import limits, operations
from kirim.address_book import AddressBook
from kirim.addresses import fallback_problem, kind_of
from kirim.callbacks import CallbackAuth
from kirim.channels import Channel, close_provider
from kirim.clock import Clock, SystemClock
from kirim.config import Config
from kirim.errors import (
    ConfigError,
    IdempotencyKeyReused,
    InvalidNotification,
    PayloadTooLarge,
    UnknownChannel,
)
from kirim.feeds import FeedChangeListener, Feeds
from kirim.keys import canonical_json, default_key, payload_hash
from kirim.model import (
    CallbackStatus,
    Delivery,
    DeliveryStatus,
    Doubt,
    EnqueueResult,
    Record,
    RecordFilter,
)
from kirim.notify import fanout, messages
from kirim.notify.fanout import EventResult
from kirim.notify.types import NotificationType
from kirim.observe.logging import get_logger
from kirim.operations import By, Page
from kirim.preferences import Preferences, check_recipient_id
from kirim.store import open_store
from kirim.store.base import (
    ActivityBucket,
    Callback,
    CallbackResult,
    EnqueuesIn,
    NewDelivery,
    RequestBegin,
    RequestedDelivery,
    RequestSlot,
    Respond,
    Store,
    StoredResponse,
)
from kirim.store.event_writes import EventWrite, Request, Written
from kirim.text import stored_text
from kirim.topic_book import TopicBook
from kirim.validation import MAX_EPOCH, BadValue, check_key, check_payload, check_text
from kirim.worker import Worker, WorkerSettings
from kirim.worker.checkpoint import Checkpoint
from kirim.workflows import Runs, event_runs, plan_runs

if TYPE_CHECKING:
    from kirim.observe.metrics import Metrics

T = TypeVar("T")
SendAfter = datetime | timedelta | float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Notification:
    """What ``notify`` says: the delivery, and whether this call created it."""

    delivery_id: int
    idempotency_key: str
    created: bool
    status: DeliveryStatus
    #: the key's delivery was pruned (retention) while its tombstone still holds the key:
    #: nothing was written, and ``status`` is the status it had when pruned
    pruned: bool = False
    #: what kirim does not know for certain about it (``assumed_sent``: sent under the
    #: channel's assumption; ``held``: in doubt, for an operator; ``resolved``: a doubt
    #: settled), a pruned delivery's too
    doubt: Doubt | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NotifyRequest:
    event_id: str
    recipient: str
    channel: str
    payload: Any
    key: str | None = None
    send_after: SendAfter = None


class Kirim(AddressBook, Feeds, TopicBook, Runs):
    """Notifications on one store, with the channels of one configuration."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        store: Store | None = None,
        channels: Mapping[str, Channel] | None = None,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        types: Iterable[NotificationType] = (),
    ) -> None:
        self.config = config or Config()
        #: notification types by name: the configuration's, then those given here
        self.types = {**self.config.types, **{t.name: t for t in types}}
        #: counts enqueue conflicts here; given to the workers of ``worker()``
        self.metrics = metrics
        # Without a clock of its own the app keeps time by the database's clock, so that
        # hosts whose clocks disagree agree on leases; an explicit clock (tests, tools
        # that move time by hand) is the time of record instead.
        self.store = store or open_store(
            self.config.database,
            time="database" if clock is None else None,
            listen_url=self.config.listen_url,
        )
        self.clock = clock or SystemClock()
        self._channels = dict(channels) if channels is not None else None
        if self._channels is not None:
            _check_fallback_kinds(self._channels)
        self._callback_auth: dict[str, CallbackAuth | None] = {}
        self.log = get_logger()
        #: told of each change to a recipient's feed made in this process, after its
        #: commit: (recipient id, "new" | "state" | "delete", feed item id; 0 for a bulk
        #: mark). The workers of ``worker()`` and the feed verbs call it; on PostgreSQL
        #: every feed write also says pg_notify('kirim_feed', recipient id) for the others
        self.on_feed_change: list[FeedChangeListener] = []

    @property
    def channel_names(self) -> set[str]:
        if self._channels is not None:
            return set(self._channels)
        return set(self.config.channels)

    def channels(self) -> dict[str, Channel]:
        """The channels, with their providers built (once); ConfigError if one cannot be."""
        if self._channels is None:
            channels = {}
            for name, spec in self.config.channels.items():
                try:
                    channels[name] = spec.build()
                except (TypeError, ValueError) as exc:
                    raise ConfigError(f"channels.{name}: {exc}") from None
            self._channels = channels
        return self._channels

    async def open(self, *, migrate: bool = False) -> Kirim:
        await self.store.open()
        if migrate:
            await self.store.migrate()
        else:
            await self.store.check_schema()
        return self

    async def close(self) -> None:
        if self._channels is not None:
            for channel in self._channels.values():
                await close_provider(channel.provider)
        await self.store.close()

    async def __aenter__(self) -> Kirim:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- enqueue ---------------------------------------------------------------------

    async def notify(
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
        """Record one notification; the same key again returns the existing delivery.

        With ``connection`` (an open ``psycopg.AsyncConnection`` of the application,
        PostgreSQL only) the delivery and its job are written inside the caller's
        transaction: the notification exists if and only if that transaction commits.

        Raises ``InvalidNotification`` (nothing written) or ``IdempotencyKeyReused``.
        """
        request = NotifyRequest(
            event_id=event_id,
            recipient=recipient,
            channel=channel,
            payload=payload,
            key=key,
            send_after=send_after,
        )
        return (await self.notify_many([request], connection=connection))[0]

    async def notify_many(
        self, requests: Sequence[NotifyRequest], *, connection: Any = None
    ) -> list[Notification]:
        """Record many notifications in one transaction (all validated first)."""
        now = self.clock.now()
        items = [self._validate(r, now) for r in requests]
        results = await self._enqueue(items, now, connection)
        out = []
        for item, result in zip(items, results, strict=True):
            self._recorded(item, result, connection)
            d = result.delivery
            out.append(
                Notification(
                    delivery_id=d.id,
                    idempotency_key=d.idempotency_key,
                    created=result.created,
                    status=d.status,
                    pruned=result.pruned,
                    doubt=d.doubt,
                )
            )
        return out

    async def _enqueue(
        self, items: list[NewDelivery], now: float, connection: Any
    ) -> list[EnqueueResult]:
        """One transaction: the store's, or the caller's (``connection``). A key that
        names another notification (``refuse_reused``) rolls the store's transaction
        back whole; in the caller's, it is raised before the caller commits."""
        refuse = refuse_reused(items)
        if connection is None:
            return await self.store.enqueue(items, now=now, refuse=refuse)
        results = await self._in_callers().enqueue_in(connection, items, now=now)
        refuse(results)
        return results

    def _in_callers(self) -> EnqueuesIn:
        """The store, as one that writes in the caller's transaction (``connection=``);
        ``ConfigError`` where it cannot."""
        if not getattr(self.store, "enqueues_in", False):
            raise ConfigError(
                "notify(connection=...) needs the PostgreSQL backend (transactional enqueue)"
            )
        return cast(EnqueuesIn, self.store)

    async def handle_requests(
        self,
        begin: Sequence[RequestBegin],
        enqueue: Sequence[RequestedDelivery],
        *,
        hold: float,
        respond: Respond,
    ) -> tuple[list[RequestSlot], list[tuple[EnqueueResult, StoredResponse | None]]]:
        """One step of the HTTP intake (``Ledger.handle_requests``: keys taken, and
        deliveries recorded with the response kept for replays, in one transaction),
        each recorded delivery counted and logged as ``notify_many`` does: the HTTP
        service and the library take one path into the ledger."""
        slots, done = await self.store.handle_requests(
            begin, enqueue, now=self.clock.now(), hold=hold, respond=respond
        )
        for it, (result, _) in zip(enqueue, done, strict=True):
            self._recorded(it.delivery, result, None)
        return slots, done

    async def give_back_request(self, key: str, token: str) -> None:
        """Release an HTTP request's key (``handle_requests``): it was refused, and an
        error is not replayed."""
        await self.store.enqueue_request(
            [], key=key, token=token, now=self.clock.now(), respond=lambda _: None
        )

    def _recorded(self, item: NewDelivery, result: EnqueueResult, connection: Any) -> None:
        """Count and log one result (its key was checked: ``_enqueue``)."""
        d = result.delivery
        if not result.created and self.metrics is not None:
            self.metrics.enqueue_conflict(item.channel)
        if result.created and d.status == DeliveryStatus.SUPPRESSED and self.metrics is not None:
            self.metrics.suppressed(d.channel, d.reason or "")
        # In the caller's transaction the delivery is only staged: it exists once
        # (and if) the caller commits, which kirim does not see.
        created = "enqueued" if connection is None else "staged"
        self.log.info(
            created if result.created else "enqueue_conflict",
            notification_id=d.id,
            event_id=d.event_id,
            idempotency_key=d.idempotency_key,
            channel=d.channel,
            job_id=None if result.job is None else result.job.id,
        )

    # -- notification types (kirim.notify) ---------------------------------------------

    def notification_type(self, name: str) -> NotificationType:
        """The type named ``name``; ``InvalidNotification`` naming the known ones."""
        found = self.types.get(name) if isinstance(name, str) else None
        if found is None:
            known = ", ".join(sorted(self.types)) or "none configured"
            raise InvalidNotification(f"unknown notification type {name!r} (known: {known})")
        return found

    async def notify_event(
        self,
        type: str,
        recipients: Any,
        data: Mapping[str, Any],
        *,
        event_id: str,
        connection: Any = None,
    ) -> EventResult:
        """One event of a notification type to every recipient, one delivery per
        recipient x channel, in one transaction (``connection`` as for ``notify``).

        Every template is rendered first: a template error or a missing variable raises
        ``RenderError`` (an ``InvalidNotification``) and nothing is written. Then the
        recipients' preferences suppress or defer deliveries, and throttles and digests
        apply (``kirim.notify.fanout``). The same event again returns the deliveries it
        made (created false). ``recipients``: ids, ``{"id", "locale", "to"}`` mappings or
        ``kirim.notify.Recipient``; ``to`` maps a channel to the address on it."""
        # rendered off the event loop: a heavy template, or many recipients, never
        # stalls what else the loop runs (a worker's sends and heartbeats)
        event = await asyncio.to_thread(
            self.prepare_event, type, recipients, data, event_id=event_id
        )
        return await self.record_event(event, connection=connection)

    def prepare_event(
        self, type: str, recipients: Any, data: Mapping[str, Any], *, event_id: str
    ) -> fanout.Event:
        """``notify_event``'s first half: the event checked and every template rendered,
        nothing read or written. Raises ``InvalidNotification`` (``RenderError``)."""
        return fanout.prepare(
            self.notification_type(type),
            recipients,
            data,
            event_id=event_id,
            channels=self.channel_names,
            max_payload_bytes=self.config.max_payload_bytes,
        )

    async def record_event(
        self,
        event: fanout.Event,
        *,
        connection: Any = None,
        request: tuple[str, str] | None = None,
        respond: Callable[[EventResult], tuple[int, str]] | None = None,
        fingerprint: str | None = None,
    ) -> EventResult:
        """``notify_event``'s second half: preferences read, deliveries planned and
        recorded in one transaction. ``request`` (the HTTP service's key and lock token,
        with ``respond``: the status and body to keep for replays, and ``fingerprint``:
        the body's): that request's row is completed in the same transaction, or
        released when a key was reused. A workflow type's event starts one run per
        recipient instead (``kirim.workflows``), and an event a type names in
        ``cancel_on`` cancels that type's matching runs."""
        now = self.clock.now()
        cancels = self._cancels_of(event.type.name, event.data)
        if event.type.steps:
            runs = plan_runs(event, self.config.max_attempts)
            written = await self._write_event(
                EventWrite(runs=runs, cancels=cancels),
                now,
                connection,
                request,
                respond,
                fingerprint,
                lambda w: self._event_result(event, w, [], now),
            )
            return self._event_result(event, written, [], now)
        prefs = await self.store.preferences_of(event.recipient_ids)
        addresses = await self.store.addresses_of(event.recipient_ids)
        planned = fanout.plan(
            event,
            prefs,
            now=now,
            max_attempts=self.config.max_attempts,
            addresses=addresses,
            needs_address=self.address_channels(),
        )
        items = [p.delivery for p in planned]
        written = await self._write_event(
            EventWrite(deliveries=items, cancels=cancels),
            now,
            connection,
            request,
            respond,
            fingerprint,
            lambda w: self._event_result(event, w, planned, now),
        )
        for p, result in zip(planned, written.deliveries, strict=True):
            self._recorded(p.delivery, result, connection)
        return self._event_result(event, written, planned, now)

    async def _write_event(
        self,
        write: EventWrite,
        now: float,
        connection: Any,
        request: tuple[str, str] | None,
        respond: Callable[[EventResult], tuple[int, str]] | None,
        fingerprint: str | None,
        result_of: Callable[[Written], EventResult],
    ) -> Written:
        """``record_event``'s one transaction (``kirim.store.event_writes``): the
        store's, the caller's (``connection``), or the HTTP request's (``request``:
        the response kept in it)."""
        refuse = refuse_reused(write.deliveries)
        if connection is not None:
            if request is not None:
                raise InvalidNotification("record_event: a request or a connection, not both")
            written = await self._in_callers().record_event_in(connection, write, now=now)
            refuse(list(written.deliveries))  # raised before the caller commits
            return written
        if request is None:
            return await self.store.record_event(write, now=now, refuse=refuse)
        key, token = request

        def kept(w: Written) -> StoredResponse:
            status, body = (respond or _no_response)(result_of(w))
            return StoredResponse(status_code=status, body=body)

        asked = Request(key=key, token=token, respond=kept, fingerprint=fingerprint)
        return await self.store.record_event(replace(write, request=asked), now=now, refuse=refuse)

    @staticmethod
    def _event_result(
        event: fanout.Event, written: Written, planned: Sequence[fanout.Planned], now: float
    ) -> EventResult:
        return EventResult(
            type=event.type.name,
            event_id=event.event_id,
            deliveries=tuple(
                fanout.outcome(p, r, now=now)
                for p, r in zip(planned, written.deliveries, strict=True)
            ),
            runs=event_runs(written.runs),
            canceled=written.canceled,
        )

    def render(
        self,
        type: str,
        data: Any,
        *,
        locale: str | None = None,
        channel: str | None = None,
    ) -> dict[str, dict[str, Any]]:
        """The payloads ``notify_event`` would record for ``data`` (channel -> payload),
        rendered in ``locale`` (None: the type's default); nothing is read or written.
        A digest type's ``data``: one event's data or a list of them."""
        return messages.preview(self.notification_type(type), data, locale=locale, channel=channel)

    def prepare(self, request: NotifyRequest, *, now: float | None = None) -> NewDelivery:
        """Validate one request as ``notify`` does and return what it would write
        (nothing is written). Raises ``InvalidNotification``."""
        return self._validate(request, self.clock.now() if now is None else now)

    def _validate(self, r: NotifyRequest, now: float) -> NewDelivery:
        """The one check of a notification, for ``notify()``, the CLI and the API alike
        (rules in ``kirim.validation``); raises ``InvalidNotification``."""
        try:
            event_id = check_text("event_id", _as_text(r.event_id), limit=limits.EVENT_ID)
            recipient = check_text("recipient", _as_text(r.recipient), limit=limits.RECIPIENT)
            channel = check_text("channel", _as_text(r.channel), limit=limits.CHANNEL)
            key = None if r.key is None else check_key(r.key)
        except BadValue as exc:
            raise InvalidNotification(str(exc)) from None
        if channel not in self.channel_names:
            known = ", ".join(sorted(self.channel_names)) or "none configured"
            raise UnknownChannel(f"unknown channel {channel!r} (known: {known})")
        try:
            text = canonical_json(r.payload)
        except (TypeError, ValueError) as exc:
            raise InvalidNotification(f"payload is not JSON: {exc}") from None
        except RecursionError:
            raise InvalidNotification("payload is not JSON: nested too deeply") from None
        size = len(text)  # canonical JSON is ASCII (every other character is escaped)
        if size > self.config.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload is {size} bytes, over the limit of {self.config.max_payload_bytes}"
            )
        # A NUL or a lone surrogate anywhere in the payload is written as a \u escape,
        # so a text without one has neither: only then is the payload walked (to name
        # where the bad character is).
        if "\\u" in text:
            try:
                check_payload(r.payload)
            except BadValue as exc:
                raise InvalidNotification(str(exc)) from None
        return NewDelivery(
            idempotency_key=key or default_key(event_id, recipient, channel),
            event_id=event_id,
            recipient=recipient,
            channel=channel,
            payload_json=text,
            payload_hash=payload_hash(text),
            run_at=_run_at(r.send_after, now),
            max_attempts=self.config.max_attempts,
            payload=r.payload,
        )

    # -- the operator's verbs (kirim.operations): the CLI, the API, the dashboard ----

    async def get(self, key_or_id: str | int, *, by: By = "auto") -> Record | None:
        """A delivery with its latest job and every attempt, or None. ``key_or_id``: an
        idempotency key, else the id a digit string names (an int is an id); ``by="id"``
        or ``"key"`` says which."""
        return await operations.get(self.store, key_or_id, by)

    async def records(
        self, where: RecordFilter | None = None, *, cursor: int | None = None, limit: int = 50
    ) -> Page:
        """A page of deliveries (newest first unless ``where.oldest_first``), each with
        its latest job and attempts; pass ``next_cursor`` back for the next page."""
        return await operations.records(self.store, where, cursor, limit)

    async def dead_letters(self, *, limit: int = 100) -> list[Record]:
        """Deliveries whose job is dead (failed for good, out of attempts, or held in
        doubt), oldest dead job first."""
        return await operations.dead_letters(self.store, limit)

    async def in_doubt(self, *, limit: int = 100) -> list[Record]:
        """Deliveries in doubt (held for an operator), newest first."""
        return (await self.records(operations.IN_DOUBT, limit=limit)).records

    async def activity(self, *, since: float, bucket: float = 60.0) -> list[ActivityBucket]:
        """Deliveries sent, failed and in doubt per ``bucket`` seconds from ``since`` until
        now (the dashboard's chart; see ``Operator.activity`` for what is counted)."""
        return await self.store.activity(since=since, until=self.clock.now(), bucket=bucket)

    async def cancel(
        self, key_or_id: str | int, *, dead_only: bool = False, by: By = "auto"
    ) -> Record:
        """Cancel a delivery that is neither in flight nor sent (``dead_only``: only a
        dead letter); the record after. Raises ``NotFound``, ``ActionRefused`` or
        ``NotSettled`` (an earlier request may still land)."""
        now = self.clock.now()
        return await operations.cancel(self.store, key_or_id, now=now, dead_only=dead_only, by=by)

    async def retry(self, key_or_id: str | int, *, by: By = "auto") -> Record:
        """Requeue a dead letter with a fresh job; the record after. An earlier doubt is
        released (the operator accepts that the user may get a second copy: see
        ``second_copy_possible``), unless the provider can be asked: then the worker
        asks it before sending anything. Raises ``NotFound``, ``ActionRefused`` or
        ``NotSettled``."""
        return await operations.retry(
            self.store, key_or_id, now=self.clock.now(), by=by, channels=self.known_channels()
        )

    def second_copy_possible(self, record: Record) -> bool:
        """Whether retrying this dead letter now may give its user a second copy (an
        earlier request may have arrived, and neither a lookup nor a provider's key
        will keep the resend from being a second message)."""
        return operations.second_copy_possible(record, self.known_channels(), now=self.clock.now())

    async def reconcile(self, key_or_id: str | int, *, by: By = "auto") -> Record:
        """Ask the provider of a delivery in doubt whether it has it (``lookup``) and
        settle the doubt either way: sent (resolved) or, once nothing can still land,
        back to the queue while its job has attempts left (its route goes on: a
        fallback after a refusal for good), else failed (resolved; a retry then sends
        no second copy). The record after. Raises
        ``NotFound``, ``NotSettled`` or ``ActionRefused``."""
        return await operations.reconcile(
            self.store, self.known_channels(), key_or_id, now=self.clock.now, by=by
        )

    def known_channels(self) -> dict[str, Channel]:
        """The channels, built when they can be (a tool without providers gets none)."""
        try:
            return self.channels()
        except ConfigError:
            return {}

    # -- recipients' preferences (kirim prefs, /v1/recipients/{id}/preferences) --------

    async def preferences(self, recipient_id: str) -> Preferences | None:
        """The recipient's preferences; None when they set none (each type's defaults
        apply). BadValue (a ValueError) for an id that cannot be one."""
        return await self.store.get_preferences(check_recipient_id(recipient_id))

    async def set_preferences(self, prefs: Preferences) -> Preferences:
        """Replace the recipient's preferences, all of them (a field left at its default
        is reset); returns them as stored, with ``updated_at``. Checked first (a
        ``Preferences`` built by hand too): BadValue naming the field. Deliveries
        already queued follow the new preferences when they are claimed."""
        checked = Preferences.from_json(prefs.recipient_id, prefs.to_json())
        return await self.store.set_preferences(checked, now=self.clock.now())

    async def delete_preferences(self, recipient_id: str) -> bool:
        """Forget the recipient's preferences (each type's defaults apply again); False
        when there were none."""
        return await self.store.delete_preferences(check_recipient_id(recipient_id))

    # -- delivery callbacks (POST /v1/callbacks/{channel}) ------------------------------

    def callback_auth(self, channel: str) -> CallbackAuth | None:
        """How ``channel``'s delivery callbacks are verified; None: the channel has them
        off, or there is no such channel (the providers are not built for this)."""
        if self._channels is not None:
            found = self._channels.get(channel)
            return None if found is None else found.callback
        spec = self.config.channels.get(channel)
        if spec is None:
            return None
        auth = self._callback_auth.get(channel)
        if auth is None:
            auth = self._callback_auth[channel] = spec.callback_auth()
        return auth

    async def confirm(
        self,
        channel: str,
        message_id: str,
        status: CallbackStatus | str,
        *,
        key: str | None = None,
        reason: str | None = None,
        at: float | None = None,
    ) -> CallbackResult:
        """Apply a provider's (verified) delivery callback: ``delivered`` moves the
        delivery to delivered, ``bounced`` or ``failed`` to bounced, resolving any doubt;
        a second message id confirmed for one delivery is a measured duplicate. Never
        sends anything. ``key``: the idempotency key the provider was given, for a
        message id kirim never learned. ``InvalidNotification`` for a message id or key
        over its limit (``kirim.limits``); a longer reason is kept cut."""
        try:  # the limits of the indexes that find the delivery (kirim.limits)
            message_id = check_text("message_id", message_id, limit=limits.MESSAGE_ID)
            key = None if key is None else check_text("key", key, limit=limits.KEY)
        except BadValue as exc:
            raise InvalidNotification(str(exc)) from None
        callback = Callback(
            channel=channel,
            message_id=message_id,
            status=CallbackStatus(status),
            key=key,
            reason=stored_text(reason, limit=limits.REASON.bytes),
            reported_at=at,
            now=self.clock.now(),
        )
        result = await self.store.confirm(callback)
        if self.metrics is not None:
            self.metrics.callback(
                channel, str(callback.status), str(result.outcome), duplicate=result.duplicate
            )
        return result

    def worker(
        self,
        *,
        settings: WorkerSettings | None = None,
        worker_id: str | None = None,
        checkpoints: Checkpoint | None = None,
        metrics: Metrics | None = None,
    ) -> Worker:
        """A worker on this store and these channels (with this app's metrics, if any)."""
        return Worker(
            self.store,
            self.channels(),
            settings=settings or self.config.worker,
            worker_id=worker_id,
            clock=self.clock,
            checkpoints=checkpoints,
            metrics=metrics if metrics is not None else self.metrics,
            policies={name: t.policy for name, t in self.types.items()},
            digests=messages.composers(self.types),
            on_feed=self.feed_changed,
            render_run=messages.run_renderer(self.types, self.config.max_payload_bytes),
            topics=self.plan_topic_batch,
        )


def _check_fallback_kinds(channels: Mapping[str, Channel]) -> None:
    """ConfigError for a fallback that takes another kind of address than its channel
    (``kirim.addresses.fallback_problem``), as the configuration's loader checks."""
    for name, channel in channels.items():
        for other in channel.fallback:
            found = channels.get(other)
            if found is None:
                continue  # not configured here: its deliveries are refused by the worker
            problem = fallback_problem(
                name, kind_of(channel.provider), other, kind_of(found.provider)
            )
            if problem is not None:
                raise ConfigError(problem)


def reused_field(existing: Delivery, item: NewDelivery) -> str | None:
    """Where ``item`` differs from the delivery its key already names, or None.

    The first of ``event_id``, ``recipient``, ``channel`` and ``payload`` (by its
    hash) that differs: one key is one business action, so any difference means the
    key was reused for another notification. ``notify`` and the HTTP intake both ask.
    """
    if existing.event_id != item.event_id:
        return "event_id"
    if existing.recipient != item.recipient:
        return "recipient"
    if existing.channel != item.channel:
        return "channel"
    if existing.payload_hash != item.payload_hash:
        return "payload"
    return None


def refuse_reused(items: Sequence[NewDelivery]) -> Callable[[Sequence[EnqueueResult]], None]:
    """The check ``enqueue`` runs inside its transaction: ``IdempotencyKeyReused`` for
    the first result that is a delivery of another notification under its item's key,
    so that a batch (or an event's fan-out) with one reused key writes nothing. A
    pruned delivery's fields are gone, and a digest's payload is a placeholder until
    sealed (its event was checked by the store): neither is compared."""

    def refuse(results: Sequence[EnqueueResult]) -> None:
        for item, result in zip(items, results, strict=True):
            if result.created or result.pruned or item.digest is not None:
                continue
            if (field := reused_field(result.delivery, item)) is not None:
                raise IdempotencyKeyReused(item.idempotency_key, result.delivery.id, field)

    return refuse


def _no_response(result: EventResult) -> tuple[int, str]:
    raise AssertionError("record_event(request=...) needs respond")


def _as_text(value: Any) -> Any:
    """An int id (not a bool) as its text; anything else (or an int past Python's
    digit limit) as it is, for ``check_text`` to refuse."""
    if isinstance(value, int) and not isinstance(value, bool):
        with contextlib.suppress(ValueError):
            return str(value)
    return value


def _run_at(send_after: SendAfter, now: float) -> float | None:
    """Epoch seconds, between 1970 and the end of 9999 (what every output can show)."""
    if send_after is None:
        return None  # due at once, in the store's time
    if isinstance(send_after, timedelta):
        when = now + send_after.total_seconds()
    elif isinstance(send_after, datetime):
        if send_after.tzinfo is None:
            raise InvalidNotification("send_after must be timezone-aware")
        try:
            when = send_after.timestamp()
        except (OverflowError, ValueError, OSError):
            when = math.inf
    elif isinstance(send_after, int | float) and not isinstance(send_after, bool):
        try:
            when = float(send_after)
        except OverflowError:  # an int past any float
            when = math.inf
    else:
        raise InvalidNotification("send_after must be a datetime, a timedelta or epoch seconds")
    if not 0 <= when <= MAX_EPOCH:  # nan included
        raise InvalidNotification("send_after must fall between 1970-01-01 and 9999-12-31 (UTC)")
    return when


def __getattr__(name: str) -> Any:
    """``kirim.engine.SyncKirim``, where it was before it moved to ``kirim.sync``
    (deprecated: import it from ``kirim.sync``)."""
    if name == "SyncKirim":
        import warnings

        from kirim.sync import SyncKirim

        warnings.warn(
            "kirim.engine.SyncKirim is deprecated: import SyncKirim from kirim.sync",
            DeprecationWarning,
            stacklevel=2,
        )

        return SyncKirim
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
