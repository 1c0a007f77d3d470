"""One store over a driver: every operation written once, run by either database.

``SQLStore`` plays every role of ``kirim.store.base.Store``. Each of its methods is
one ``Operation`` (``kirim.store.sequence``: the transitions, reads, intake,
recipients, addresses, digests, rates, retention) handed to its ``Driver``, which
runs it in one transaction and answers its steps from the dialect's ``sql/`` files.
A dialect keeps only its driver, its SQL and its migrations; what a driver can do
beyond the common part is declared as attributes (``listens``, ``enqueues_in``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar, cast

from kirim.addresses import Address
from kirim.errors import StoreError
from kirim.inbox import FeedAction, FeedCounts, FeedFilter, FeedItem, FeedMark, FeedPage
from kirim.model import Attempt, Delivery, EnqueueResult, Job, Record, RecordFilter
from kirim.preferences import Preferences, TypePolicy
from kirim.runs import RenderGathered, Run, RunClaim, RunStatus
from kirim.store import (
    addresses,
    digests,
    event_writes,
    feed,
    feed_changes,
    flows,
    imports,
    intake,
    rates,
    reads,
    recipients,
    retention,
    topics,
    transitions,
)
from kirim.store.base import (
    ActivityBucket,
    ApiToken,
    Callback,
    CallbackResult,
    Claim,
    Compose,
    DeadLetter,
    Finish,
    FinishResult,
    Intent,
    Lease,
    NewDelivery,
    QueueStats,
    Reaped,
    Refuse,
    RequestBegin,
    RequestedDelivery,
    RequestSlot,
    Respond,
    StoredResponse,
    StoreTime,
    Waiting,
)
from kirim.store.feed_changes import FeedChanges
from kirim.store.sequence import Operation
from kirim.topics import Subscription, TopicCounts, TopicEvent, TopicInfo

T = TypeVar("T")


class Driver(Protocol):
    """What a database gives the store: open, close, the schema, and running one
    operation in one transaction."""

    dialect: str
    url: str
    time: StoreTime
    #: optional capabilities: LISTEN/NOTIFY wake-ups, operations inside the
    #: application's own transaction, and the plain finish as one fenced statement on
    #: its own (PostgreSQL's; without it, the fenced statements and the careful way
    #: share the finish's one transaction: ``transitions.finish_fenced_first``)
    listens: bool
    enqueues_in: bool
    finishes_fenced: bool

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def migrate(self) -> int: ...

    async def schema_version(self) -> int: ...

    async def check_schema(self) -> None: ...

    async def run(self, op: Operation[T], *, write: bool = True, snapshot: bool = True) -> T:
        """Run ``op`` in one transaction (a read: without the write lock; a read of one
        statement, ``snapshot`` False: as the driver likes best)."""
        ...

    def committed(self, intents: Sequence[Intent], done: Sequence[bool]) -> None:
        """Told the intents just committed (PostgreSQL's driver watches its ledger
        after a lost connection: ``postgres.ledger``)."""
        ...


class Listening(Protocol):
    """A driver that ``listens``: LISTEN/NOTIFY wake-ups."""

    async def wait_for_jobs(self, timeout: float) -> bool: ...  # noqa: ASYNC109


class EnqueuingIn(Protocol):
    """A driver that ``enqueues_in``: operations in a caller's open transaction."""

    async def run_in(self, conn: Any, op: Operation[T]) -> T: ...


class FinishingFenced(Protocol):
    """A driver that ``finishes_fenced``: an operation of one statement, atomic on its
    own, run outside any transaction (one round trip); ``transitions.FenceRaced`` when
    the statement aborted itself (``finish_fenced``)."""

    async def run_alone(self, op: Operation[T]) -> T: ...


class SQLStore:
    """Every store operation, on the database of ``driver``."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.dialect = driver.dialect
        self.url = driver.url
        self.listens = driver.listens
        self.enqueues_in = driver.enqueues_in
        self.finishes_fenced = driver.finishes_fenced
        #: ``finish`` the careful way alone, never by the fenced statements: the
        #: reference the tests hold those statements to
        self.careful_only = False
        self.time: StoreTime = driver.time

    async def _op(self, op: Operation[T]) -> T:
        """A write: one transaction."""
        return await self.driver.run(op)

    async def _read(self, op: Operation[T], *, snapshot: bool = False) -> T:
        """A read: one statement (``snapshot`` False), or several in one snapshot."""
        return await self.driver.run(op, write=False, snapshot=snapshot)

    # -- schema -------------------------------------------------------------------

    async def open(self) -> None:
        await self.driver.open()

    async def close(self) -> None:
        await self.driver.close()

    async def migrate(self) -> int:
        return await self.driver.migrate()

    async def schema_version(self) -> int:
        return await self.driver.schema_version()

    async def check_schema(self) -> None:
        await self.driver.check_schema()

    # -- write path ---------------------------------------------------------------

    async def enqueue(
        self, items: Sequence[NewDelivery], *, now: float, refuse: Refuse | None = None
    ) -> list[EnqueueResult]:
        if not items:
            return []
        return await self._op(_refused(intake.enqueue(items, now), refuse))

    async def enqueue_in(
        self, conn: Any, items: Sequence[NewDelivery], *, now: float
    ) -> list[EnqueueResult]:
        """Enqueue inside the caller's open transaction on ``conn``; nothing is committed:
        the deliveries (and the workers' wake-up) exist when, and only if, the caller
        commits. Only where the store ``enqueues_in`` (else StoreError)."""
        if not self.enqueues_in:
            raise StoreError(f"the {self.dialect} store cannot enqueue in your transaction")
        return await cast(EnqueuingIn, self.driver).run_in(conn, intake.enqueue(items, now))

    async def claim(
        self,
        *,
        worker_id: str,
        now: float,
        lease: float,
        limit: int,
        policies: Mapping[str, TypePolicy] | None = None,
    ) -> list[Claim]:
        if limit == 0:
            return []
        op = transitions.claim(worker_id, now, lease, reads.limit(limit), policies)
        return await self._op(op)

    async def heartbeat(self, leases: Sequence[Lease], *, now: float, lease: float) -> list[bool]:
        if not leases:
            return []
        return await self._op(transitions.heartbeat(leases, now, lease))

    async def not_found(
        self,
        delivery_id: int,
        request_ids: Sequence[str],
        *,
        now: float,
        error: str | None = None,
    ) -> None:
        if request_ids:
            await self._op(transitions.not_found(delivery_id, request_ids, now, error))

    async def record_intents(self, intents: Sequence[Intent]) -> list[bool]:
        """Where the driver runs one statement on its own (``finishes_fenced``), the
        intents' insert is one (the read of which were written, when some claims were
        lost, another, after its commit)."""
        if not intents:
            return []
        op = transitions.record_intents(intents)
        if self.finishes_fenced:
            done = await cast(FinishingFenced, self.driver).run_alone(op)
        else:
            done = await self._op(op)
        self.driver.committed(intents, done)
        return done

    async def finish(self, items: Sequence[Finish]) -> list[FinishResult]:
        """The fenceable items first by the fenced statements (``transitions.finish_fenced``),
        then the others, and those whose fence failed, the careful way
        (``transitions.finish``). Where the driver ``finishes_fenced`` (PostgreSQL's one
        statement on its own), the careful way in a transaction of its own; elsewhere
        both in the finish's one transaction (``transitions.finish_fenced_first``).
        ``careful_only``: the careful way alone."""
        if not items:
            return []
        if self.careful_only or not any(map(transitions.fenceable, items)):
            return await self._op(transitions.finish(items))
        if not self.finishes_fenced:
            try:
                return await self._op(transitions.finish_fenced_first(items))
            except transitions.FenceRaced:  # rolled back: every item the careful way
                return await self._op(transitions.finish(items))
        fenced: list[FinishResult | None]
        try:
            driver = cast(FinishingFenced, self.driver)
            fenced = await driver.run_alone(transitions.finish_fenced(items))
        except transitions.FenceRaced:  # nothing was written: every item the careful way
            fenced = [None] * len(items)
        rest = [it for it, done in zip(items, fenced, strict=True) if done is None]
        careful = await self._op(transitions.finish(rest)) if rest else []
        return transitions.merged(fenced, careful)

    async def reap(self, *, now: float, in_commit: Collection[str] = ()) -> list[Reaped]:
        return await self._op(transitions.reap(now, in_commit))

    async def release(self, leases: Sequence[Lease], *, now: float) -> None:
        if leases:
            await self._op(transitions.release(leases, now))

    async def wait_for_jobs(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait until a job may have become claimable (an enqueue, a retry, a released
        or reaped lease, here or on any host): True when notified, False on timeout.
        Only where the store ``listens`` (else StoreError: poll instead)."""
        if not self.listens:
            raise StoreError(f"the {self.dialect} store cannot wait for jobs: poll instead")
        return await cast(Listening, self.driver).wait_for_jobs(timeout)

    async def next_run_at(self) -> float | None:
        return await self._read(reads.next_run_at())

    async def ping(self) -> None:
        await self._read(reads.ping())

    async def next_due_in(self, *, now: float) -> float | None:
        return await self._read(reads.next_due_in(now))

    async def in_flight(self) -> int:
        return await self._read(reads.in_flight())

    async def waiting(self, *, now: float) -> Waiting:
        return await self._read(reads.waiting(now))

    async def queue_stats(self, *, now: float) -> QueueStats:
        return await self._read(reads.queue_stats(now), snapshot=True)

    # -- read path and operator actions -------------------------------------------

    async def get_delivery(
        self, key_or_id: str, *, by: Literal["auto", "id", "key"] = "auto"
    ) -> Delivery | None:
        return await self._read(reads.get_delivery(key_or_id, by))

    async def get_job(self, delivery_id: int) -> Job | None:
        return await self._read(reads.get_job(delivery_id))

    async def record(
        self, key_or_id: str | int, *, by: Literal["auto", "id", "key"] = "auto"
    ) -> Record | None:
        return await self._read(reads.record(str(key_or_id), by), snapshot=True)

    async def records(
        self, where: RecordFilter, *, cursor: int | None = None, limit: int = 50
    ) -> list[Record]:
        return await self._read(reads.records(where, cursor, limit), snapshot=True)

    async def attempts_of_many(self, delivery_ids: Sequence[int]) -> dict[int, list[Attempt]]:
        if not delivery_ids:
            return {}
        return await self._read(reads.attempts_of_many(delivery_ids))

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        return await self._read(reads.dead_letters(limit))

    async def retry_dead(self, delivery_id: int, *, now: float, release: bool = True) -> bool:
        return await self._op(transitions.retry_dead(delivery_id, now, release))

    async def reconcile(
        self,
        delivery_id: int,
        *,
        now: float,
        found: bool,
        message_id: str | None,
        seen: int,
    ) -> bool:
        return await self._op(transitions.reconcile(delivery_id, now, found, message_id, seen))

    async def cancel(self, delivery_id: int, *, now: float) -> bool:
        return await self._op(transitions.cancel(delivery_id, now))

    async def confirm(self, callback: Callback) -> CallbackResult:
        return await self._op(transitions.confirm(callback))

    async def apply_kept_callbacks(self, *, now: float, limit: int = 100) -> list[CallbackResult]:
        return await self._op(transitions.apply_kept(now, reads.limit(limit)))

    async def counts(self) -> dict[str, dict[str, int]]:
        return await self._read(reads.counts(), snapshot=True)

    async def search_deliveries(self, text: str, *, limit: int = 50) -> list[Delivery]:
        return await self._read(reads.search_deliveries(text, limit))

    async def figures(self) -> list[dict[str, Any]]:
        return await self._read(reads.figures())

    async def activity(self, *, since: float, until: float, bucket: float) -> list[ActivityBucket]:
        return await self._read(reads.activity(since, until, bucket))

    # -- the HTTP service: API tokens and idempotent requests ---------------------

    async def create_token(
        self, name: str, token_hash: str, *, prefix: str, now: float
    ) -> ApiToken | None:
        return await self._op(reads.create_token(name, token_hash, prefix, now))

    async def verify_token(self, token_hash: str) -> ApiToken | None:
        return await self._read(reads.verify_token(token_hash))

    async def revoke_token(self, name_or_id: str, *, now: float) -> ApiToken | None:
        return await self._op(reads.revoke_token(name_or_id, now))

    async def list_tokens(self, *, include_revoked: bool = False) -> list[ApiToken]:
        return await self._read(reads.list_tokens(include_revoked))

    async def handle_requests(
        self,
        begin: Sequence[RequestBegin],
        enqueue: Sequence[RequestedDelivery],
        *,
        now: float,
        hold: float,
        respond: Respond,
    ) -> tuple[list[RequestSlot], list[tuple[EnqueueResult, StoredResponse | None]]]:
        if not begin and not enqueue:
            return [], []
        return await self._op(intake.handle_requests(begin, enqueue, now, hold, respond))

    async def enqueue_request(
        self,
        items: Sequence[NewDelivery],
        *,
        key: str,
        token: str,
        now: float,
        respond: Callable[[Sequence[EnqueueResult]], StoredResponse | None],
        fingerprint: str | None = None,
    ) -> list[EnqueueResult]:
        op = intake.enqueue_request(items, key, token, now, respond, fingerprint)
        return await self._op(op)

    async def record_event(
        self, write: event_writes.EventWrite, *, now: float, refuse: Refuse | None = None
    ) -> event_writes.Written:
        return await self._op(event_writes.record(write, now, refuse))

    async def record_event_in(
        self, conn: Any, write: event_writes.EventWrite, *, now: float
    ) -> event_writes.Written:
        """``record_event`` inside the caller's open transaction on ``conn``: nothing is
        committed; all of it exists when, and only if, the caller commits."""
        if not self.enqueues_in:
            raise StoreError(f"the {self.dialect} store cannot write in your transaction")
        driver = cast(EnqueuingIn, self.driver)
        return await driver.run_in(conn, event_writes.record(write, now))

    # -- topics (kirim.store.topics) -----------------------------------------------

    async def subscribe(self, topic: str, recipient_id: str, *, now: float) -> Subscription:
        return await self._op(topics.subscribe(topic, recipient_id, now))

    async def unsubscribe(self, topic: str, recipient_id: str, *, now: float) -> bool:
        return await self._op(topics.unsubscribe(topic, recipient_id, now))

    async def topics_of(self, recipient_id: str) -> list[str]:
        return await self._read(topics.topics_of(recipient_id))

    async def subscribers(
        self, topic: str, *, after: str | None = None, limit: int = 100
    ) -> list[str]:
        return await self._read(topics.subscribers(topic, after, limit))

    async def list_topics(self, *, limit: int = 100) -> list[TopicInfo]:
        return await self._read(topics.list_topics(limit))

    async def topic_info(self, topic: str, *, recent: int = 10) -> TopicInfo | None:
        return await self._read(topics.topic_info(topic, recent), snapshot=True)

    async def latest_topic_events(self, *, limit: int = 20) -> list[TopicEvent]:
        return await self._read(topics.latest_events(limit))

    async def record_topic_event(
        self,
        topic: str,
        type: str,
        event_id: str,
        data_json: str,
        *,
        now: float,
        cancels: Sequence[event_writes.CancelBy] = (),
    ) -> TopicEvent:
        op = event_writes.topic_event(
            topics.record_event(topic, type, event_id, data_json, now), cancels, now
        )
        return await self._op(op)

    async def claim_topic_event(
        self, *, worker_id: str, now: float, lease: float
    ) -> TopicEvent | None:
        return await self._op(topics.claim_event(worker_id, now, lease))

    async def topic_batch(self, event: TopicEvent, *, limit: int) -> list[str]:
        return await self._read(topics.batch_of(event, limit))

    async def expand_topic_batch(
        self,
        event: TopicEvent,
        token: str,
        recipients: Sequence[str],
        items: event_writes.TopicBatch,
        *,
        last: bool,
        now: float,
        lease: float,
    ) -> event_writes.Written | None:
        op = topics.expand_batch(event, token, recipients, items, last=last, given=now, lease=lease)
        return await self._op(op)

    async def topic_events_expanding(self) -> int:
        return await self._read(topics.expanding())

    async def topic_counts(self) -> TopicCounts:
        return await self._read(topics.counts(), snapshot=True)

    # -- recipients' preferences and addresses ------------------------------------

    async def get_preferences(self, recipient_id: str) -> Preferences | None:
        return (await self.preferences_of([recipient_id])).get(recipient_id)

    async def preferences_of(self, recipient_ids: Sequence[str]) -> dict[str, Preferences]:
        if not recipient_ids:
            return {}
        return await self._read(recipients.preferences_of(recipient_ids))

    async def set_preferences(self, prefs: Preferences, *, now: float) -> Preferences:
        return await self._op(recipients.set_preferences(prefs, now))

    async def delete_preferences(self, recipient_id: str) -> bool:
        return await self._op(recipients.delete_preferences(recipient_id))

    async def add_address(
        self, recipient_id: str, channel: str, address: str, *, label: str | None, now: float
    ) -> Address:
        return await self._op(addresses.add_address(recipient_id, channel, address, label, now))

    async def addresses_of(self, recipient_ids: Sequence[str]) -> dict[str, list[Address]]:
        if not recipient_ids:
            return {}
        return await self._read(addresses.addresses_of(recipient_ids))

    async def list_addresses(self, recipient_id: str) -> list[Address]:
        return await self._read(addresses.list_addresses(recipient_id))

    async def retire_address(self, channel: str, address: str, *, reason: str, now: float) -> int:
        return await self._op(addresses.retire_address(channel, address, reason, now))

    async def remove_address(self, recipient_id: str, channel: str, address: str) -> bool:
        return await self._op(addresses.remove_address(recipient_id, channel, address))

    async def retired_addresses(self) -> dict[str, int]:
        return await self._read(addresses.retired_addresses())

    # -- recipients' feeds, the in-app inbox (``kirim.store.feed``) -----------------

    async def feed_page(
        self, recipient_id: str, which: FeedFilter, limit: int, before: int | None
    ) -> FeedPage:
        return await self._read(feed.page(recipient_id, which, limit, before), snapshot=True)

    async def feed_counts(self, recipient_id: str) -> FeedCounts:
        return await self._read(feed.counts(recipient_id))

    async def feed_action(
        self, recipient_id: str, item_id: int, action: FeedAction, *, now: float
    ) -> tuple[FeedItem, bool] | None:
        return await self._op(feed.act(recipient_id, item_id, action, now))

    async def mark_feed(
        self, recipient_id: str, ids: Sequence[int] | None, mark: FeedMark, *, now: float
    ) -> int:
        return await self._op(feed.mark(recipient_id, ids, mark, now))

    async def delete_feed_item(self, recipient_id: str, item_id: int, *, now: float) -> bool:
        return await self._op(feed.delete(recipient_id, item_id, now))

    # -- the order of the feeds' changes (``kirim.store.feed_changes``) -------------

    async def feed_changes(self, recipient_id: str, after: int, limit: int) -> FeedChanges:
        return await self._read(
            feed_changes.changes_after(recipient_id, after, limit), snapshot=True
        )

    async def feed_head(self, recipient_id: str) -> int:
        return await self._read(feed_changes.head(recipient_id))

    async def feed_last_number(self) -> int:
        return await self._read(feed_changes.last_number())

    # -- the notification layer: digests and provider request rates -----------------

    async def seal_digest(
        self, delivery_id: int, token: str, *, now: float, compose: Compose
    ) -> Delivery | None:
        return await self._op(digests.seal(delivery_id, token, now, compose))

    async def take_rate_slot(
        self, channel: str, rate: float, *, now: float, within: float | None = None
    ) -> float:
        return await self._op(rates.take_slot(channel, rate, now, within))

    # -- workflow runs (``kirim.store.flows``) ----------------------------------------

    async def start_runs(self, items: Sequence[flows.NewRun], *, now: float) -> list[flows.Started]:
        if not items:
            return []
        return await self._op(flows.start(items, now))

    async def claim_runs(
        self, *, worker_id: str, now: float, lease: float, limit: int
    ) -> list[RunClaim]:
        return await self._op(flows.claim(worker_id, now, lease, limit))

    async def advance_run(
        self, run_id: int, token: str, *, now: float, render: RenderGathered | None = None
    ) -> flows.Advanced | None:
        return await self._op(flows.advance(run_id, token, now, render))

    async def advance_runs(
        self,
        claims: Sequence[tuple[int, str]],
        *,
        now: float,
        render: RenderGathered | None = None,
    ) -> list[flows.Advanced | None]:
        if not claims:
            return []
        return await self._op(flows.advance_many(claims, now, render))

    async def cancel_run(self, run_id: int, *, why: str, now: float) -> flows.Canceled | None:
        return await self._op(flows.cancel(run_id, why, now))

    async def runs_to_cancel(self, type: str, value: str) -> list[int]:
        return await self._read(flows.to_cancel(type, value))

    async def get_run(self, run_id: int) -> Run | None:
        return await self._read(flows.get(run_id), snapshot=True)

    async def list_runs(self, *, status: RunStatus | None = None, limit: int = 100) -> list[Run]:
        return await self._read(flows.list_runs(status, limit))

    async def run_counts(self) -> dict[str, int]:
        return await self._read(flows.counts())

    # -- retention ----------------------------------------------------------------

    async def import_keys(
        self, keys: Sequence[str], *, now: float, dry_run: bool = False
    ) -> imports.ImportResult:
        """One batch of ``kirim.store.imports.import_keys``: one transaction (a dry run
        only reads)."""
        return await self.driver.run(imports.import_keys(keys, now, dry_run), write=not dry_run)

    async def prune(
        self,
        *,
        now: float,
        keep: float,
        keys: float,
        limit: int = 500,
        dry_run: bool = False,
        archived: float | None = None,
    ) -> retention.PruneResult:
        """One batch of ``kirim.store.retention.prune``: one transaction (a dry run only
        reads, without the write lock)."""
        op = retention.prune(now, keep, keys, limit, dry_run, archived)
        return await self.driver.run(op, write=not dry_run)


def _refused(
    op: Operation[list[EnqueueResult]], refuse: Refuse | None
) -> Operation[list[EnqueueResult]]:
    """``op``, then ``refuse`` on its results inside the transaction: raising rolls it
    back."""
    results = yield from op
    if refuse is not None:
        refuse(results)
    return results
