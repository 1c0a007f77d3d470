"""The storage interface every backend implements, and the values it exchanges.

Each method is one transaction. Batch methods take many items and return one
result per item in the same order, so a worker can group the writes of many
in-flight deliveries into one commit. All times are epoch seconds on one time line,
the store's *time of record* (``StoreTime``): by default the ``now`` each caller
passes (tests drive leases without sleeping); an application opens its store on
the database's clock, so that lease expiry, takeover, reaping, due-ness and
settled-ness never depend on two hosts' clocks agreeing. Durations (a lease, a
backoff) are added to the time of record by the store, never by the caller.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from kirim.addresses import Address
from kirim.clock import Clock
from kirim.frozen import quick_init
from kirim.inbox import (
    FeedAction,
    FeedCounts,
    FeedFilter,
    FeedItem,
    FeedMark,
    FeedMessage,
    FeedPage,
)
from kirim.model import (
    Attempt,
    AttemptStatus,
    CallbackStatus,
    Delivery,
    DeliveryStatus,
    Doubt,
    EnqueueResult,
    Job,
    JobStatus,
    Record,
    RecordFilter,
)
from kirim.preferences import Preferences, TypePolicy

if TYPE_CHECKING:
    from kirim.runs import RenderGathered, Run, RunClaim, RunStatus
    from kirim.store.event_writes import CancelBy, EventWrite, TopicBatch, Written
    from kirim.store.feed_changes import FeedChanges
    from kirim.store.flows import Advanced, Canceled, NewRun, Started
    from kirim.store.retention import PruneResult
    from kirim.topics import Subscription, TopicCounts, TopicEvent, TopicInfo

SCHEMA_VERSION = 19

#: A store's time of record. None: each caller's ``now`` (one host, or tests that move
#: time by hand). "database": the database's clock (PostgreSQL's own; for SQLite the
#: host's, which every process on the file shares). A ``Clock``: that clock (tests and
#: the explorer, which give every host its own skewed clock but one time of record).
StoreTime = Clock | Literal["database"] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class NewDelivery:
    idempotency_key: str
    event_id: str
    recipient: str
    channel: str
    payload_json: str
    payload_hash: str
    #: when the job is due, in store time; None: at once (the store's now, so that an
    #: app host whose clock runs ahead does not delay it)
    run_at: float | None
    max_attempts: int
    #: ``notify_event``: the notification type, and the recipient whose preferences
    #: and throttle rule the delivery (``recipient`` is the channel's address)
    type: str | None = None
    recipient_id: str | None = None
    #: recorded at once as ``suppressed`` with this reason (``kirim.preferences.Reason``);
    #: its job is written completed, so no worker runs it
    suppressed: str | None = None
    #: at most ``limit`` deliveries per window of the throttle's scope (``Throttle``)
    throttle: Throttle | None = None
    #: one event of a digest (``DigestEvent``): the store adds it to the stream's open
    #: digest and returns that digest's delivery (its key derived from stream + window)
    digest: DigestEvent | None = None
    #: the value ``payload_json`` encodes, when the caller has it (``Kirim.prepare``):
    #: the delivery a store returns for a new row then holds it instead of decoding the
    #: JSON again (None: decoded). Not compared: the JSON text is what counts
    payload: Any = field(default=None, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Throttle:
    """At most ``limit`` deliveries per fixed ``window`` (seconds, windows aligned on
    the epoch, in store time) in ``scope`` (e.g. ``recipient:u1``), counted in the
    ledger (``kirim_throttle``) in the enqueue's transaction, so exact across hosts.
    Over the limit: ``suppress`` records the delivery suppressed (reason ``throttled``);
    ``defer`` moves its ``run_at`` to the first later window with room."""

    scope: str
    limit: int
    window: float
    over: Literal["suppress", "defer"] = "suppress"


@dataclass(frozen=True, slots=True, kw_only=True)
class DigestEvent:
    """One event for the digest of ``stream`` (type, digest key, channel): the store
    puts it in the stream's digest for the window that holds ``now`` (store time,
    windows of ``window`` seconds aligned on the epoch), or the next one if that digest
    is already sealed; the digest's delivery is due when its window ends. Each
    ``event_id`` goes into one digest of its stream, once. The enqueue's result is the
    digest delivery's; its ``created`` says whether this event was new (added now)."""

    stream: str
    window: float
    event_id: str
    data_json: str


#: The payload of a digest's delivery (``Notifications.seal_digest``), from the delivery
#: (its placeholder payload, type, recipient, channel) and its events, oldest first:
#: each ``{"event_id": str, "data": <the event's data>, "at": <store time it came>}``.
#: Called inside the seal's transaction: pure and quick; what it raises rolls it back.
Compose = Callable[[Delivery, list[dict[str, Any]]], Any]


class ClaimKind(enum.StrEnum):
    CLAIMED = "claimed"  # the delivery is ours: go on
    NOOP = "noop"  # the delivery was already final; the job was completed
    BUSY = "busy"  # another worker holds an unexpired claim; the job was put back


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    kind: ClaimKind
    job: Job
    delivery: Delivery
    token: str
    #: earlier attempts that may have reached the provider (requested/unknown)
    doubtful: tuple[Attempt, ...] = ()
    reason: str = ""
    #: attempt rows (outbound requests) the delivery already had when claimed
    prior_requests: int = 0
    #: the store's time at the claim (the time of record, see ``StoreTime``)
    now: float = 0.0
    #: the latest ``settles_at`` of the doubtful attempts, when later than ``now``:
    #: until then an earlier request may still land (``Attempt.settled``)
    unsettled_until: float | None = None
    #: every earlier attempt since the operator's last release, oldest first: the
    #: failover route is read from them (``kirim.worker.decisions.route``)
    history: tuple[Attempt, ...] = ()
    #: a NOOP claim whose delivery the claim-time check of the recipient's preferences
    #: just suppressed: the reason (``kirim.preferences.Reason``)
    suppressed: str | None = None
    #: a CLAIMED delivery the recipient's preferences now refuse while an earlier
    #: request may have reached the provider: the reason. Nothing more may be sent; the
    #: in-doubt policy settles the doubt without sending (``Decisions.in_doubt``)
    withheld: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    job_id: int
    delivery_id: int
    token: str


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Intent:
    """A write-ahead attempt row, committed only if the claim token still holds."""

    delivery_id: int
    job_id: int
    token: str
    number: int
    provider_request_id: str
    worker_id: str
    requested_at: float
    #: no request of this attempt leaves after this (store time: the claim's time plus
    #: the worker's send bound); None: no bound (tests of the store only)
    send_deadline: float | None = None
    #: ... and none can land after this (the deadline plus the request timeout)
    settles_at: float | None = None
    #: the channel whose provider the request goes to: the delivery's own, or one of
    #: its fallbacks (None: the delivery's own, tests of the store only)
    provider: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptOutcome:
    provider_request_id: str
    status: AttemptStatus
    provider_message_id: str | None
    error: str | None
    completed_at: float


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Finish:
    """The end of one claim: attempt outcome, delivery status and job state at once.

    The delivery and job are written only if ``token`` still holds; the attempt
    outcome is written in any case, and a late success still marks the delivery sent.
    """

    delivery_id: int
    job_id: int
    token: str
    now: float
    attempt: AttemptOutcome | None
    delivery_status: DeliveryStatus
    doubt: Doubt | None = None
    provider_message_id: str | None = None
    error: str | None = None
    job_status: JobStatus = JobStatus.COMPLETED
    #: when the job runs again, in store time (a time the store gave, such as
    #: ``Claim.unsettled_until``)
    run_at: float | None = None
    #: ... or in this many seconds from the commit, in store time (a backoff: never
    #: the worker's own clock, which may disagree with the store's)
    delay: float | None = None
    #: the claim does not count as an attempt (it only waited for doubt to settle)
    refund_attempt: bool = False
    #: why a delivery ends ``suppressed`` (its ``reason`` column)
    reason: str | None = None
    #: an inbox delivery's message (``kirim.inbox``): written into its recipient's feed
    #: in this transaction when it leaves the delivery sent, once per key
    feed: FeedMessage | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class FinishResult:
    committed: bool  # False: the token was stale and the transition was rejected
    delivery_status: DeliveryStatus | None  # the status written (or found after a late success)
    job_status: JobStatus | None
    late_success: bool = False
    #: a late definite failure withdrew an assumption (``logic.reopen``)
    reopened: bool = False
    #: the id of the feed message this finish wrote (``Finish.feed``; None: none written,
    #: or it was there already)
    feed_item: int | None = None
    #: what a committed finish wrote: the doubt and the error, which the store's rules
    #: may have changed from the worker's proposal (a doubt gone meanwhile, a success
    #: that outranks a failure)
    doubt: Doubt | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Reaped:
    job_id: int
    delivery_id: int
    attempt: int
    owner: str | None
    dead: bool
    channel: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStats:
    """A snapshot of the store for gauges (``Store.queue_stats``)."""

    #: deliveries per status (every status, zeros included)
    deliveries: Mapping[str, int]
    #: deliveries in doubt: status ``in_doubt``, or sent under ``assumed_sent``
    in_doubt: int
    #: claimable jobs that are due now
    queue_depth: int
    #: how long the oldest due job has been waiting (0 when none is due)
    oldest_due_age_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiting:
    """The jobs a burst worker waits for, and those it leaves (``Queue.waiting``); times
    are the store's."""

    #: jobs waiting for a retry, and when the first of them is due
    retries: int = 0
    next_retry_at: float | None = None
    #: jobs running under a lease (this worker's or another's), and when the last ends
    running: int = 0
    lease_ends_at: float | None = None
    #: jobs queued for later (``send_after``): a burst worker does not wait for them
    later: int = 0
    next_later_at: float | None = None


def waiting_from(rows: Sequence[Mapping[str, Any]]) -> Waiting:
    """``Waiting`` of the ``waiting_jobs`` query's rows (one per job status)."""
    by = {str(r["status"]): r for r in rows}

    def n(status: str) -> int:
        return int(by[status]["n"]) if status in by else 0

    def at(status: str, column: str) -> float | None:
        value = by[status][column] if status in by else None
        return None if value is None else float(value)

    return Waiting(
        retries=n("retry_scheduled"),
        next_retry_at=at("retry_scheduled", "first_run_at"),
        running=n("running"),
        lease_ends_at=at("running", "last_lease"),
        later=n("queued"),
        next_later_at=at("queued", "first_run_at"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    delivery: Delivery
    job: Job


@dataclass(frozen=True, slots=True, kw_only=True)
class Callback:
    """A provider's delivery callback, verified (``Operator.confirm``)."""

    channel: str
    #: the provider's id of its message
    message_id: str
    status: CallbackStatus
    #: the idempotency key the provider was given, when its callback carries it: how a
    #: message id kirim never learned (a request whose answer was lost) finds its delivery
    key: str | None = None
    reason: str | None = None
    #: when the provider says it happened (epoch seconds), if it says
    reported_at: float | None = None
    now: float = 0.0


class CallbackOutcome(enum.StrEnum):
    APPLIED = "applied"  # the delivery's status changed
    RECORDED = "recorded"  # a new message id, or the provider's new word: status unchanged
    REPEATED = "repeated"  # said before (a resent callback): nothing changed
    UNKNOWN = "unknown"  # no delivery of this channel has this message id (or key)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallbackResult:
    outcome: CallbackOutcome
    delivery_id: int | None = None
    #: the delivery's status after the callback, and before it
    status: DeliveryStatus | None = None
    previous: DeliveryStatus | None = None
    #: the doubt the callback settled (``assumed_sent`` or ``held``), if it settled one
    resolved: Doubt | None = None
    #: the callback confirmed a second (third…) message id for one delivery: the
    #: provider holds two messages for one notification, a measured duplicate
    duplicate: bool = False
    #: every message id confirmed for the delivery so far, oldest first
    message_ids: tuple[str, ...] = ()
    #: an ``unknown`` callback was kept, to be applied once its message is recorded
    kept: bool = False


#: the most buckets one ``Operator.activity`` read gives (24 h by the minute: 1,440)
MAX_ACTIVITY_BUCKETS = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivityBucket:
    """What happened in ``[start, start + bucket)`` (``Operator.activity``): deliveries
    that reached ``sent``, ``failed`` or doubt then, each counted once, by its current
    status."""

    start: float
    sent: int = 0
    failed: int = 0
    in_doubt: int = 0

    @staticmethod
    def span(*, since: float, until: float, bucket: float) -> int:
        """How many buckets cover ``[since, until)``; ValueError for a window that is
        not one (not finite, reversed, a bucket <= 0, more than MAX_ACTIVITY_BUCKETS)."""
        if not all(math.isfinite(x) for x in (since, until, bucket)):
            raise ValueError("activity: since, until and bucket must be finite numbers")
        if bucket <= 0 or until < since:
            raise ValueError("activity: needs bucket > 0 and since <= until")
        count = math.ceil((until - since) / bucket)
        if count > MAX_ACTIVITY_BUCKETS:
            raise ValueError(f"activity: more than {MAX_ACTIVITY_BUCKETS} buckets asked for")
        return count

    @classmethod
    def series(
        cls, rows: Iterable[Mapping[str, Any]], *, since: float, until: float, bucket: float
    ) -> list[ActivityBucket]:
        """Every bucket of ``[since, until)``, oldest first, empty ones included, from
        the ``activity`` query's rows (``i``: the bucket's number, ``kind``, ``n``)."""
        count = cls.span(since=since, until=until, bucket=bucket)
        tally = [{"sent": 0, "failed": 0, "in_doubt": 0} for _ in range(count)]
        for row in rows:
            i = min(max(int(row["i"]), 0), count - 1)  # float rounding at the edges
            tally[i][str(row["kind"])] += int(row["n"])
        return [cls(start=since + i * bucket, **t) for i, t in enumerate(tally)]


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiToken:
    """A bearer token of the HTTP service. The token itself is never stored: its sha256 is."""

    id: int
    name: str
    #: the token's first characters, to recognise it in a list
    prefix: str
    created_at: float
    revoked_at: float | None


class RequestState(enum.StrEnum):
    ACQUIRED = "acquired"  # the caller holds the idempotency key now: go on
    IN_PROGRESS = "in_progress"  # another request with this key is being processed
    COMPLETED = "completed"  # answered before: replay the stored response


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestBegin:
    """An HTTP request that wants an idempotency key (``Store.begin_requests``)."""

    idempotency_key: str
    #: sha256 of the request's canonical body
    fingerprint: str
    #: fences this request's completion (a fresh token per request)
    lock_token: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestSlot:
    state: RequestState
    #: the fingerprint of the request that holds (or held) the key
    fingerprint: str
    status_code: int | None = None
    response: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestedDelivery:
    """A delivery to enqueue for a request that holds its key (``lock_token``)."""

    delivery: NewDelivery
    lock_token: str
    #: the request body's fingerprint: a request that creates the delivery keeps its
    #: answer even if another took its key over meanwhile (the same body), so that the
    #: taker's release cannot lose it
    fingerprint: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredResponse:
    """The response kept with a completed request, replayed for the same key."""

    status_code: int
    body: str


#: Given an enqueue's result, the response to keep, or None to keep nothing (the row is
#: released: an error is not replayed). Called inside the transaction: pure and quick.
Respond = Callable[[EnqueueResult], StoredResponse | None]
#: a check of an enqueue's results inside its transaction (``Ledger.enqueue``): raising
#: rolls the transaction back (a key that names another notification, say)
Refuse = Callable[[Sequence[EnqueueResult]], None]


# -- the store, by role ----------------------------------------------------------------
#
# Each caller names the role it needs (the worker a ``WorkerStore``, the token
# commands ``Tokens``…); ``Store`` is all of them, which ``SQLStore`` implements on
# either driver. The roles are ``runtime_checkable`` so that a test can ask a store
# which it plays. The optional capabilities are declared, not guessed: a store says
# ``listens`` (it has ``WaitsForJobs.wait_for_jobs``) and ``enqueues_in`` (it has
# ``EnqueuesIn.enqueue_in``); a caller reads the flag, never ``isinstance``, which
# looks for names only (``inspect.getattr_static`` from Python 3.12 on: a proxy's
# ``__getattr__`` is not seen).


@runtime_checkable
class Lifecycle(Protocol):
    """Opening, closing and the schema of one backend."""

    url: str
    #: the folder of its SQL files under ``kirim.store``: ``sqlite`` or ``postgres``
    dialect: str
    #: declared capabilities: ``wait_for_jobs`` (LISTEN/NOTIFY wake-ups) and
    #: ``enqueue_in`` (enqueue in the caller's own transaction) are there to call
    listens: bool
    enqueues_in: bool

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def migrate(self) -> int:
        """Apply pending migrations; return the schema version."""
        ...

    async def schema_version(self) -> int:
        """The schema version the database has (0: no kirim schema), read only."""
        ...

    async def check_schema(self) -> None:
        """Raise SchemaError when the schema is missing or newer than the code."""
        ...


@runtime_checkable
class Queue(Protocol):
    """What a worker needs: claim due jobs, record their attempts, finish them."""

    async def claim(
        self,
        *,
        worker_id: str,
        now: float,
        lease: float,
        limit: int,
        policies: Mapping[str, TypePolicy] | None = None,
    ) -> list[Claim]:
        """Lease up to ``limit`` due jobs and claim their deliveries. A delivery whose
        type is in ``policies`` is checked again against its recipient's preferences,
        in the same transaction (``rules.preference_check``): suppressed (a NOOP
        claim), or deferred to its send window (not returned)."""
        ...

    async def heartbeat(self, leases: Sequence[Lease], *, now: float, lease: float) -> list[bool]:
        """Extend job leases and delivery claims; False where the token was lost."""
        ...

    async def record_intents(self, intents: Sequence[Intent]) -> list[bool]:
        """Insert attempt rows where the claim token still holds."""
        ...

    async def not_found(
        self,
        delivery_id: int,
        request_ids: Sequence[str],
        *,
        now: float,
        error: str | None = None,
    ) -> None:
        """Record that the delivery's provider, asked once these requests had settled,
        has none of them: not processed (a fact, whoever holds the delivery; an outcome
        already recorded never changes). ``error``: why it is known (None: the
        provider's lookup said so; ``rules.UNWRITTEN``: a request of a channel
        whose effect is its finish's commit, which never came)."""
        ...

    async def finish(self, items: Sequence[Finish]) -> list[FinishResult]: ...

    async def reap(self, *, now: float, in_commit: Collection[str] = ()) -> list[Reaped]:
        """Return jobs whose lease expired to the queue (or to the dead letters);
        ``in_commit``: channels whose effect is written in the finish's own commit, whose
        uncommitted attempts are no doubt (``transitions.reap``)."""
        ...

    async def release(self, leases: Sequence[Lease], *, now: float) -> None:
        """Give back leases at shutdown: jobs return to the queue now, and delivery
        claims are revoked so that the next claimer takes over (and sees any attempt)."""
        ...

    async def next_run_at(self) -> float | None:
        """The run_at of the earliest claimable job, if any."""
        ...

    async def ping(self) -> None:
        """One round trip that reads nothing: does the database answer? (StoreError
        when it does not.)"""
        ...

    async def waiting(self, *, now: float) -> Waiting:
        """The jobs running, waiting for a retry, and queued for after ``now`` (the
        caller's time; the store's time of record when it keeps one)."""
        ...

    async def next_due_in(self, *, now: float) -> float | None:
        """Seconds until the earliest claimable job is due (<= 0: due), measured in the
        store's time of record (``now``: the caller's time, used when that is it)."""
        ...

    async def in_flight(self) -> int:
        """Unfinished work of earlier claims: jobs running or scheduled for a retry."""
        ...

    async def retire_address(self, channel: str, address: str, *, reason: str, now: float) -> int:
        """Mark the address dead on the channel for every recipient that has it (the
        worker's, when a service answers ``DeadAddress``); the number retired."""
        ...

    async def queue_stats(self, *, now: float) -> QueueStats:
        """Deliveries per status, in-doubt count, due jobs and the oldest one's age."""
        ...


@runtime_checkable
class Operator(Protocol):
    """What an operator reads and does: look deliveries up, retry, cancel, count."""

    async def get_delivery(
        self, key_or_id: str, *, by: Literal["auto", "id", "key"] = "auto"
    ) -> Delivery | None:
        """The delivery with this idempotency key (``by="key"``), this id (``by="id"``,
        a decimal string), or ``auto``: the key, else the id a digit string names."""
        ...

    async def get_job(self, delivery_id: int) -> Job | None:
        """The delivery's most recent job."""
        ...

    async def record(
        self, key_or_id: str | int, *, by: Literal["auto", "id", "key"] = "auto"
    ) -> Record | None:
        """The delivery (found as ``get_delivery`` finds it), its most recent job and
        its attempts, read in one transaction."""
        ...

    async def records(
        self, where: RecordFilter, *, cursor: int | None = None, limit: int = 50
    ) -> list[Record]:
        """A page of deliveries with their latest jobs and attempts (two statements in one
        transaction): ids below ``cursor``, newest first, or with ``where.oldest_first``
        ids above it, oldest first."""
        ...

    async def attempts_of_many(self, delivery_ids: Sequence[int]) -> dict[int, list[Attempt]]:
        """Every attempt of these deliveries (one statement), oldest first."""
        ...

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]: ...

    async def retry_dead(self, delivery_id: int, *, now: float, release: bool = True) -> bool:
        """Requeue a dead-lettered delivery; the operator releases any earlier doubt
        (``release`` False: the doubt is kept, for the worker to ask the provider)."""
        ...

    async def reconcile(
        self,
        delivery_id: int,
        *,
        now: float,
        found: bool,
        message_id: str | None,
        seen: int,
    ) -> bool:
        """Settle a delivery's doubt with its provider's answer to ``lookup``
        (``kirim.store.transitions.reconcile``); False when it changed since the
        provider was asked (``seen``: its attempts then)."""
        ...

    async def cancel(self, delivery_id: int, *, now: float) -> bool:
        """Cancel a delivery that is not in flight and not sent."""
        ...

    async def confirm(self, callback: Callback) -> CallbackResult:
        """Apply a provider's delivery callback (``rules.confirmed``); never sends."""
        ...

    async def apply_kept_callbacks(self, *, now: float, limit: int = 100) -> list[CallbackResult]:
        """Apply the kept callbacks (``confirm`` of a message no delivery had recorded)
        whose delivery is recorded now, and forget those kept for a day; one
        transaction. The results of those applied."""
        ...

    async def counts(self) -> dict[str, dict[str, int]]:
        """{"deliveries": {status: n}, "jobs": {status: n}}."""
        ...

    async def search_deliveries(self, text: str, *, limit: int = 50) -> list[Delivery]:
        """Deliveries whose id, idempotency key or event id is ``text``, newest first."""
        ...

    async def figures(self) -> list[dict[str, Any]]:
        """Deliveries per channel, status, doubt and the status of each one's latest job
        (``job_status``, None without one), counted (``n``): the dashboard's figures
        (``kirim.http.figures``)."""
        ...

    async def activity(self, *, since: float, until: float, bucket: float) -> list[ActivityBucket]:
        """Every ``bucket`` seconds of ``[since, until)`` (store time), oldest first, empty
        ones included: the deliveries that reached an outcome then, each counted once, by
        its current status, at the time it reached it. ``sent``: status sent,
        confirmed or delivered, at ``sent_at``; ``failed``: status failed or bounced, at
        ``updated_at``;
        ``in_doubt``: status in_doubt, at ``updated_at``, and those sent under
        ``assumed_sent``, at ``sent_at`` (not counted as sent). A delivery that moved on
        since (a retried dead letter, a resolved doubt) counts where it is now, or not
        at all. ValueError for a window ``ActivityBucket.span`` refuses."""
        ...


@runtime_checkable
class Tokens(Protocol):
    """The HTTP service's API tokens (schema version 2)."""

    async def create_token(
        self, name: str, token_hash: str, *, prefix: str, now: float
    ) -> ApiToken | None:
        """Store a new token's hash; None when an active token already has this name."""
        ...

    async def verify_token(self, token_hash: str) -> ApiToken | None:
        """The active (not revoked) token with this hash, if any."""
        ...

    async def revoke_token(self, name_or_id: str, *, now: float) -> ApiToken | None:
        """Revoke the active token with this name (or id); None when there is none."""
        ...

    async def list_tokens(self, *, include_revoked: bool = False) -> list[ApiToken]: ...


@runtime_checkable
class Ledger(Protocol):
    """The intake: record deliveries, and the HTTP service's idempotent requests."""

    async def enqueue(
        self, items: Sequence[NewDelivery], *, now: float, refuse: Refuse | None = None
    ) -> list[EnqueueResult]:
        """Insert deliveries and their jobs; an existing key returns the existing row.
        ``refuse`` is called with the results inside the transaction: what it raises
        rolls the whole batch back and is raised here (nothing written)."""
        ...

    async def handle_requests(
        self,
        begin: Sequence[RequestBegin],
        enqueue: Sequence[RequestedDelivery],
        *,
        now: float,
        hold: float,
        respond: Respond,
    ) -> tuple[list[RequestSlot], list[tuple[EnqueueResult, StoredResponse | None]]]:
        """One step of the HTTP intake, in one transaction (either list may be empty).

        First ``enqueue``: record the deliveries (as ``enqueue``) and complete each
        request's row with ``respond(result)``, fenced by its lock token (None releases
        the row). Then ``begin``: take each request's idempotency key until ``now +
        hold`` (a row in progress), or say that another request holds it or completed
        it (with its response); an expired hold is taken over (its server died before
        answering). A request begins in one step and enqueues in a later one, so that
        its key is seen in progress in between, by every server.
        """
        ...

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
        """Record many deliveries for one HTTP request (an event's, ``POST /v1/events``)
        and, in the same transaction, complete that request's row with
        ``respond(results)`` (fenced by its lock token; None releases it). The row
        names the first delivery, so that it goes when retention prunes that one.
        What ``respond`` raises rolls the transaction back (nothing written; the
        request's row stays as the step before left it)."""
        ...


@runtime_checkable
class Recipients(Protocol):
    """Recipients' preferences (``kirim.preferences``, schema version 7): one JSON
    document per recipient id, read by the fan-out and again at claim time."""

    async def get_preferences(self, recipient_id: str) -> Preferences | None: ...

    async def preferences_of(self, recipient_ids: Sequence[str]) -> dict[str, Preferences]:
        """The preferences of those of ``recipient_ids`` that have any (one statement)."""
        ...

    async def set_preferences(self, prefs: Preferences, *, now: float) -> Preferences:
        """Replace the recipient's whole document; returns it with its ``updated_at``
        (store time)."""
        ...

    async def delete_preferences(self, recipient_id: str) -> bool:
        """Forget the recipient's preferences; False when there were none."""
        ...


@runtime_checkable
class Addresses(Protocol):
    """Recipients' addresses per channel (``kirim.addresses``, schema version 9): read
    by the fan-out, retired by the worker when a service calls one dead."""

    async def add_address(
        self, recipient_id: str, channel: str, address: str, *, label: str | None, now: float
    ) -> Address:
        """Add the address (or register a retired one again); returns it as stored."""
        ...

    async def addresses_of(self, recipient_ids: Sequence[str]) -> dict[str, list[Address]]:
        """The addresses not retired of these recipients, by id (one statement)."""
        ...

    async def list_addresses(self, recipient_id: str) -> list[Address]:
        """Every address of one recipient, retired ones too."""
        ...

    async def remove_address(self, recipient_id: str, channel: str, address: str) -> bool:
        """Forget one address of one recipient; False when it had none such."""
        ...

    async def retired_addresses(self) -> dict[str, int]:
        """Retired addresses per channel."""
        ...


@runtime_checkable
class Notifications(Protocol):
    """What the worker needs of the notification layer (schema version 7): seal a
    digest before its delivery is sent, and pace a channel's provider requests."""

    async def seal_digest(
        self, delivery_id: int, token: str, *, now: float, compose: Compose
    ) -> Delivery | None:
        """Seal the digest of a claimed delivery and write its payload, ``compose`` of
        its events, fenced by the claim token (``kirim.store.digests.seal``). None: the
        claim no longer holds; a digest sealed before (or no digest): the delivery as
        recorded."""
        ...

    async def take_rate_slot(
        self, channel: str, rate: float, *, now: float, within: float | None = None
    ) -> float:
        """Take the channel's next request slot at ``rate`` requests per second, shared
        by every worker on the database (``kirim_rates``, one statement), if it is at
        most ``within`` seconds away (None: however far): the seconds from now (store
        time) until it (0: at once). A slot further away is not taken (nobody's slot
        moves): the answer, larger than ``within``, says how far it is."""
        ...


@runtime_checkable
class FeedStore(Protocol):
    """Recipients' feeds, the in-app inbox (``kirim.store.feed``, schema version 10).
    A message enters a feed only in the finish that marks its delivery sent."""

    async def feed_page(
        self, recipient_id: str, which: FeedFilter, limit: int, before: int | None
    ) -> FeedPage:
        """Up to ``limit`` messages older than ``before``, newest first, with counts."""
        ...

    async def feed_counts(self, recipient_id: str) -> FeedCounts:
        """The recipient's messages not archived that are not seen, and not read."""
        ...

    async def feed_action(
        self, recipient_id: str, item_id: int, action: FeedAction, *, now: float
    ) -> tuple[FeedItem, bool] | None:
        """One message after ``action``, and whether it changed (None: no such one)."""
        ...

    async def mark_feed(
        self, recipient_id: str, ids: Sequence[int] | None, mark: FeedMark, *, now: float
    ) -> int:
        """Set ``mark`` on the recipient's messages ``ids`` (None: all); how many changed."""
        ...

    async def delete_feed_item(self, recipient_id: str, item_id: int, *, now: float) -> bool:
        """Delete one message of the recipient's (its key stays taken); False when
        there is none such."""
        ...

    async def feed_changes(self, recipient_id: str, after: int, limit: int) -> FeedChanges:
        """Up to ``limit`` rows of the recipient's feed written after number ``after``
        (schema version 11: ``kirim.store.feed_changes``), with the feed's counts."""
        ...

    async def feed_head(self, recipient_id: str) -> int:
        """The number of the recipient's last feed write (0: none)."""
        ...

    async def feed_last_number(self) -> int:
        """The last number given to any feed write."""
        ...


@runtime_checkable
class Topics(Protocol):
    """Topics, their subscribers and fan-outs (``kirim.store.topics``, schema version
    12): a topic event goes to the subscriptions live at its mark, in batches."""

    async def subscribe(self, topic: str, recipient_id: str, *, now: float) -> Subscription:
        """Subscribe the recipient (``created`` False: it was already)."""
        ...

    async def unsubscribe(self, topic: str, recipient_id: str, *, now: float) -> bool:
        """End the recipient's subscription (the row stays, for fan-outs before it);
        False when it had none."""
        ...

    async def topics_of(self, recipient_id: str) -> list[str]:
        """The topics the recipient is subscribed to now."""
        ...

    async def subscribers(
        self, topic: str, *, after: str | None = None, limit: int = 100
    ) -> list[str]:
        """A page of the topic's subscribers now, by recipient id after ``after``."""
        ...

    async def list_topics(self, *, limit: int = 100) -> list[TopicInfo]:
        """Topics by name with their subscriber counts."""
        ...

    async def topic_info(self, topic: str, *, recent: int = 10) -> TopicInfo | None:
        """One topic, its subscriber count and its ``recent`` latest events."""
        ...

    async def latest_topic_events(self, *, limit: int = 20) -> list[TopicEvent]:
        """The latest events of every topic, newest first."""
        ...

    async def record_topic_event(
        self,
        topic: str,
        type: str,
        event_id: str,
        data_json: str,
        *,
        now: float,
        cancels: Sequence[CancelBy] = (),
    ) -> TopicEvent:
        """Record an event to the topic with its mark (``created`` False: recorded
        before, the same type, event id and topic), and, in the same transaction, cancel
        the runs ``cancels`` names (``kirim.store.event_writes``)."""
        ...

    async def claim_topic_event(
        self, *, worker_id: str, now: float, lease: float
    ) -> TopicEvent | None:
        """Lease the oldest topic event still expanding whose lease is free or
        expired, with a fresh token (``lease_token``)."""
        ...

    async def topic_batch(self, event: TopicEvent, *, limit: int) -> list[str]:
        """The next subscribers of the event's fan-out after its cursor, at its mark."""
        ...

    async def expand_topic_batch(
        self,
        event: TopicEvent,
        token: str,
        recipients: Sequence[str],
        items: TopicBatch,
        *,
        last: bool,
        now: float,
        lease: float,
    ) -> Written | None:
        """One batch in one transaction: the cursor moved past ``recipients``, fenced by
        ``token`` and the cursor ``event`` holds, and ``items`` recorded: its deliveries
        as ``enqueue`` records them, its runs as ``start_runs`` starts them (an existing
        key returns its row). None: nothing written (lease lost, or the batch done by
        another)."""
        ...

    async def topic_events_expanding(self) -> int:
        """How many topic events are still expanding."""

    async def topic_counts(self) -> TopicCounts:
        """How many topics and live subscriptions, and topic events pending, expanding
        and done (one snapshot)."""
        ...


class Workflows(Protocol):
    """Workflow runs (``kirim.store.flows``, schema version 14): started by an event,
    advanced by a worker under its claim, canceled by an operator or an event."""

    async def start_runs(self, items: Sequence[NewRun], *, now: float) -> list[Started]:
        """Start each run once per key (one transaction); a run given again as it is."""
        ...

    async def record_event(
        self, write: EventWrite, *, now: float, refuse: Refuse | None = None
    ) -> Written:
        """Record an event in one transaction (``kirim.store.event_writes``): its
        deliveries or its runs, the runs it cancels, and the HTTP request it answers.
        What ``refuse`` or the request's ``respond`` raises rolls all of it back."""
        ...

    async def claim_runs(
        self, *, worker_id: str, now: float, lease: float, limit: int
    ) -> list[RunClaim]:
        """Claim up to ``limit`` due runs, each with a lease and a fresh token."""
        ...

    async def advance_run(
        self, run_id: int, token: str, *, now: float, render: RenderGathered | None = None
    ) -> Advanced | None:
        """Take the run's due steps, each recorded once, fenced by ``token`` (None: the
        claim no longer holds, nothing written); ``render``: a digest holder's later
        sends (``kirim.runs.RenderGathered``)."""
        ...

    async def advance_runs(
        self,
        claims: Sequence[tuple[int, str]],
        *,
        now: float,
        render: RenderGathered | None = None,
    ) -> list[Advanced | None]:
        """``advance_run`` of each (run id, token) claimed, in one transaction (one
        commit for a batch); what one raises rolls back all of them."""
        ...

    async def cancel_run(self, run_id: int, *, why: str, now: float) -> Canceled | None:
        """Cancel a run and its deliveries that may be canceled (None: no such run)."""
        ...

    async def runs_to_cancel(self, type: str, value: str) -> list[int]:
        """The waiting runs of ``type`` whose cancellation value is ``value``."""
        ...

    async def get_run(self, run_id: int) -> Run | None:
        """A run with its recorded steps and what their deliveries are now."""
        ...

    async def list_runs(self, *, status: RunStatus | None = None, limit: int = 100) -> list[Run]:
        """The newest runs, of one status or all."""
        ...

    async def run_counts(self) -> dict[str, int]:
        """Runs per status."""
        ...


@runtime_checkable
class Prunes(Protocol):
    """A store that prunes its ledger (both drivers)."""

    async def prune(
        self,
        *,
        now: float,
        keep: float,
        keys: float,
        limit: int = 500,
        dry_run: bool = False,
        archived: float | None = None,
    ) -> PruneResult:
        """One batch (one transaction): see ``kirim.store.retention.prune`` (``archived``:
        also the feed's messages archived that long ago)."""
        ...


class WorkerStore(Queue, Notifications, Prunes, Workflows, Protocol):
    """What a worker calls: the queue, digests and provider rates, and retention; and
    whether it can ``wait_for_jobs`` (``WaitsForJobs``)."""

    listens: bool


class Store(
    Lifecycle,
    Queue,
    Operator,
    Ledger,
    Tokens,
    Recipients,
    Addresses,
    Notifications,
    FeedStore,
    Prunes,
    Topics,
    Workflows,
    Protocol,
):
    """Every role: ``kirim.store.sql.SQLStore`` (``SQLiteStore``, ``PostgresStore``)."""


# -- optional capabilities (PostgreSQL's) ----------------------------------------------


@runtime_checkable
class WaitsForJobs(Protocol):
    """A store that can wake an idle worker when work arrives (LISTEN/NOTIFY)."""

    async def wait_for_jobs(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait until a job may have become claimable: True when notified, False on
        timeout (then the caller polls, as it does when a wake-up may have been lost)."""
        ...


@runtime_checkable
class EnqueuesIn(Protocol):
    """A store that can enqueue inside the caller's own open transaction."""

    async def enqueue_in(
        self, conn: Any, items: Sequence[NewDelivery], *, now: float
    ) -> list[EnqueueResult]:
        """Enqueue on ``conn`` (a database connection in a transaction the caller
        commits or rolls back); nothing is committed here."""
        ...

    async def record_event_in(self, conn: Any, write: EventWrite, *, now: float) -> Written:
        """``Store.record_event`` on ``conn``, in the caller's open transaction:
        nothing is committed here."""
        ...
