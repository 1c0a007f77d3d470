"""The three records of kirim and their statuses.

A *delivery* is the business fact (one per idempotency key), a *job* is the
technical carrier that a worker leases, and an *attempt* is one outbound provider
request, written before the request leaves.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kirim.frozen import quick_init


class DeliveryStatus(enum.StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    SENT = "sent"
    FAILED = "failed"
    CANCELED = "canceled"
    IN_DOUBT = "in_doubt"
    #: the provider said, in a delivery callback, that the message reached the user
    DELIVERED = "delivered"
    #: the provider said, in a delivery callback, that the message did not reach the
    #: user (a bounce, or a failure after it had accepted the message)
    BOUNCED = "bounced"
    #: recipient preferences or a throttle stopped it before any request left; the
    #: delivery's ``reason`` says which (``kirim.preferences.Reason``)
    SUPPRESSED = "suppressed"

    @property
    def at_rest(self) -> bool:
        """No worker acts on it (``AT_REST``)."""
        return self in AT_REST

    #: the old name of ``at_rest`` (an assumed ``sent`` can still reopen: at rest is not
    #: final; kirim.machine.TERMINAL names the statuses no edge leaves)
    is_final = at_rest


#: Statuses no worker acts on: only a late answer, a provider's callback or an operator
#: moves them on (kirim.machine's edge table, in
#: docs/design.md, "The records and their edges"). An assumed ``sent`` can reopen.
AT_REST = frozenset(
    {
        DeliveryStatus.SENT,
        DeliveryStatus.FAILED,
        DeliveryStatus.CANCELED,
        DeliveryStatus.DELIVERED,
        DeliveryStatus.BOUNCED,
        DeliveryStatus.SUPPRESSED,
    }
)
#: the old name of ``AT_REST``
FINAL_DELIVERY = AT_REST

#: Statuses only a provider's delivery callback writes (``Kirim.confirm``).
CONFIRMED_DELIVERY = frozenset({DeliveryStatus.DELIVERED, DeliveryStatus.BOUNCED})


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    RETRY_SCHEDULED = "retry_scheduled"
    COMPLETED = "completed"
    DEAD = "dead"


#: Job statuses a worker may claim (when due).
CLAIMABLE_JOB = frozenset({JobStatus.QUEUED, JobStatus.RETRY_SCHEDULED})


class AttemptStatus(enum.StrEnum):
    REQUESTED = "requested"
    SUCCEEDED = "succeeded"
    FAILED_PERMANENT = "failed_permanent"
    FAILED_TRANSIENT = "failed_transient"
    UNKNOWN = "unknown"

    @property
    def in_doubt(self) -> bool:
        """The request may have reached the provider and its fate is not known."""
        return self in (AttemptStatus.REQUESTED, AttemptStatus.UNKNOWN)


class Doubt(enum.StrEnum):
    """Why a delivery's outcome is, or was, uncertain."""

    ASSUMED_SENT = "assumed_sent"  # at-most-once: an earlier request may have arrived
    HELD = "held"  # parked for an operator
    RESOLVED = "resolved"  # a late success or a lookup settled it


#: How a doubt reads beside a status.
DOUBT_LABEL = {Doubt.ASSUMED_SENT: "assumed", Doubt.HELD: "held", Doubt.RESOLVED: "resolved"}


class CallbackStatus(enum.StrEnum):
    """What a provider's delivery callback says of one of its messages."""

    DELIVERED = "delivered"  # it reached the user
    BOUNCED = "bounced"  # it was refused on the way (a bounce)
    FAILED = "failed"  # the provider, having accepted it, could not deliver it


class OnUnknown(enum.StrEnum):
    """What a channel does when an earlier request may have reached a provider
    that does not honour idempotency keys."""

    ASSUME_SENT = "assume_sent"
    HOLD = "hold"
    RETRY = "retry"


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    id: int
    idempotency_key: str
    event_id: str
    recipient: str
    channel: str
    payload: Any
    payload_hash: str
    status: DeliveryStatus
    claim_token: str | None
    claimed_by: str | None
    claim_expires_at: float | None
    provider_message_id: str | None
    doubt: Doubt | None
    last_error: str | None
    created_at: float
    updated_at: float
    sent_at: float | None
    #: the notification type of a delivery ``notify_event`` made (None: ``notify``)
    type: str | None = None
    #: the recipient whose preferences and throttle rule it (``notify_event``), which
    #: may differ from ``recipient``, the address of the channel
    recipient_id: str | None = None
    #: why it is ``suppressed`` (``opted_out``, ``channel_opted_out``, ``throttled``...)
    reason: str | None = None

    @property
    def status_label(self) -> str:
        """The status with its doubt beside it, as people read it: ``sent (assumed)``."""
        if self.doubt is None:
            return str(self.status)
        return f"{self.status} ({DOUBT_LABEL[self.doubt]})"


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    id: int
    delivery_id: int
    status: JobStatus
    run_at: float
    attempts: int
    max_attempts: int
    lease_owner: str | None
    lease_token: str | None
    lease_expires_at: float | None
    last_error: str | None
    created_at: float
    updated_at: float


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    id: int
    delivery_id: int
    job_id: int
    number: int
    provider_request_id: str
    worker_id: str
    status: AttemptStatus
    provider_message_id: str | None
    error: str | None
    requested_at: float
    completed_at: float | None
    #: no request of this attempt leaves after this (store time); None: written
    #: before schema version 3
    send_deadline: float | None = None
    #: after this the attempt can no longer cause a request to land (store time)
    settles_at: float | None = None
    #: the channel whose provider the request went to (the delivery's own or one of its
    #: fallbacks); None: written before schema version 6, the delivery's own
    provider: str | None = None

    def settled(self, now: float) -> bool:
        """Whether this attempt can no longer cause a request to reach the provider."""
        if not self.status.in_doubt:
            return True  # answered: whatever it did is known
        return self.settles_at is None or self.settles_at <= now


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueResult:
    delivery: Delivery
    job: Job | None
    created: bool
    #: the key's delivery was pruned (retention) and its tombstone still holds the key:
    #: ``delivery`` is rebuilt from the tombstone (id, key, final status, created_at;
    #: every other field empty), ``job`` is None, and nothing was written
    pruned: bool = False


@dataclass(frozen=True, slots=True)
class Record:
    """One delivery as an operator reads it: the delivery, its most recent job (None
    when it has none), its attempts, oldest first.

    Unpacking it as a tuple (``delivery, job, attempts = record``) or indexing it still
    works for one release, with a DeprecationWarning: read ``record.delivery``, ``.job`` and
    ``.attempts`` instead.
    """

    delivery: Delivery
    job: Job | None
    attempts: list[Attempt]

    def __iter__(self) -> Iterator[Any]:
        warnings.warn(
            "unpacking a Record as a tuple is deprecated: use record.delivery, "
            "record.job and record.attempts",
            DeprecationWarning,
            stacklevel=2,
        )
        return iter((self.delivery, self.job, self.attempts))

    def __getitem__(self, index: int) -> Any:
        warnings.warn(
            "indexing a Record is deprecated: use record.delivery, record.job and record.attempts",
            DeprecationWarning,
            stacklevel=2,
        )
        return (self.delivery, self.job, self.attempts)[index]


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordFilter:
    """Which deliveries an operator lists (``None``: any). ``since`` and ``until`` bound
    ``created_at`` (epoch seconds, ``until`` exclusive); ``dead``: only those whose most
    recent job is dead (the dead letters). Newest first unless ``oldest_first``."""

    status: DeliveryStatus | None = None
    channel: str | None = None
    doubt: Doubt | None = None
    dead: bool = False
    since: float | None = None
    until: float | None = None
    oldest_first: bool = False
