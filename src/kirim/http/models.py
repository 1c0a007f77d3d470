"""The API's request and response shapes (pydantic, for validation and the OpenAPI).

Responses reuse the JSON of ``kirim status --json`` (``kirim.views.delivery_json``)
so that the CLI and the API agree; the models here only describe it. Times are
ISO-8601 UTC strings with milliseconds (``2026-07-21T10:00:01.125Z``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from kirim import limits
from kirim.limits import Limit
from kirim.model import AttemptStatus, DeliveryStatus, Doubt, JobStatus
from kirim.preferences import Reason
from kirim.text import escape_char, first_control

#: send_after must land between these (UTC), so that every time kirim prints is valid.
EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, tzinfo=UTC)


def clean_text(value: str) -> str:
    """Text a database can keep: no NUL, no lone surrogate, not blank."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no lone surrogates)") from None
    if not value.strip():
        raise ValueError("must not be blank")
    return value


def fits(limit: Limit, *, line: bool = True) -> Callable[[str], str]:
    """The check of a text field of at most ``limit`` bytes (``kirim.limits``): storable
    (``clean_text``) and, with ``line`` (ids, names, addresses), without control
    characters. The schema's ``maxLength`` is the limit too: a character is a byte at
    least."""

    def check(value: str) -> str:
        clean_text(value)
        if line and (char := first_control(value)) is not None:
            raise ValueError(f"must not contain control characters ({escape_char(char)})")
        if (problem := limit.problem(value)) is not None:
            raise ValueError(problem)
        return value

    return check


def parse_when(value: str) -> datetime:
    """An ISO-8601 / RFC 3339 datetime with a timezone (``Z`` or an offset)."""
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            "must be an ISO-8601 datetime with a timezone, such as 2030-01-01T09:00:00Z"
        ) from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError("must have a timezone (Z or an offset such as +07:00)")
    try:
        in_range = EARLIEST <= when <= LATEST
    except OverflowError:
        in_range = False
    if not in_range:
        raise ValueError("must be between the years 0001 and 9999 in UTC")
    return when


def _when(value: str) -> str:
    parse_when(value)
    return value


EventId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=limits.EVENT_ID.bytes),
    AfterValidator(fits(limits.EVENT_ID)),
]
Address = Annotated[
    str,
    StringConstraints(min_length=1, max_length=limits.RECIPIENT.bytes),
    AfterValidator(fits(limits.RECIPIENT)),
]
ChannelName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=limits.CHANNEL.bytes),
    AfterValidator(fits(limits.CHANNEL)),
]
Key = Annotated[
    str,
    StringConstraints(min_length=1, max_length=limits.KEY.bytes),
    AfterValidator(fits(limits.KEY)),
]
MessageId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=limits.MESSAGE_ID.bytes),
    AfterValidator(fits(limits.MESSAGE_ID)),
]
ReasonText = Annotated[
    str,
    StringConstraints(min_length=1, max_length=limits.REASON.bytes),
    AfterValidator(fits(limits.REASON, line=False)),
]
When = Annotated[
    str,
    StringConstraints(min_length=1, max_length=64),
    AfterValidator(_when),
    Field(json_schema_extra={"format": "date-time"}),
]


class NotificationIn(BaseModel):
    """A notification to record (``POST /v1/notifications``)."""

    model_config = ConfigDict(extra="forbid", strict=True, title="NewNotification")

    event_id: EventId = Field(description="The business event's id (at most 1024 bytes).")
    recipient: Address = Field(
        description="Who receives it (a user id, an address; at most 1024 bytes)."
    )
    channel: ChannelName = Field(description="A channel configured on the server.")
    payload: Any = Field(
        description="Any JSON value, given to the channel's provider (at most the server's "
        "`max_payload_bytes` once encoded)."
    )
    key: Key | None = Field(
        default=None,
        description="The idempotency key, when the `Idempotency-Key` header is not used "
        "(both must then be equal). Default: sha256 of event, recipient and channel.",
    )
    send_after: When | None = Field(
        default=None,
        description="Not before this ISO-8601 datetime with a timezone (RFC 3339).",
    )


StrTime = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


class AttemptOut(BaseModel):
    """One outbound provider request, recorded before it left."""

    id: int
    job_id: int
    number: int
    provider_request_id: str
    status: AttemptStatus
    provider_message_id: str | None
    worker_id: str
    #: the channel the request went to: the delivery's own, or one of its fallbacks
    #: (null: recorded before kirim recorded it, the delivery's own)
    provider: str | None
    error: str | None
    requested_at: StrTime
    completed_at: StrTime | None


class JobOut(BaseModel):
    """The technical carrier a worker leases."""

    id: int
    status: JobStatus
    attempts: int
    max_attempts: int
    run_at: StrTime
    lease_owner: str | None
    lease_expires_at: StrTime | None
    last_error: str | None
    created_at: StrTime
    updated_at: StrTime


class DeliveryOut(BaseModel):
    """A delivery, its most recent job and every attempt (as ``kirim status --json``)."""

    id: int
    idempotency_key: str
    event_id: str
    recipient: str
    channel: str
    type: str | None = Field(description="The notification type (`POST /v1/events`), else null.")
    recipient_id: str | None = Field(
        description="The recipient whose preferences rule it (`POST /v1/events`), else null."
    )
    payload: Any
    status: DeliveryStatus
    doubt: Doubt | None
    reason: Reason | None = Field(
        description="Why it is `suppressed`: the recipient opted out (of everything, or "
        "of this type on this channel), the type is off by default on this channel "
        "(`not_opted_in`), or it was over the type's throttle; else null."
    )
    provider_message_id: str | None
    last_error: str | None
    claimed_by: str | None
    claim_expires_at: StrTime | None
    created_at: StrTime
    updated_at: StrTime
    sent_at: StrTime | None
    job: JobOut | None
    attempts: list[AttemptOut]


class RetriedOut(DeliveryOut):
    """A dead letter requeued, and whether its user may get a second copy."""

    #: an earlier request may have reached the provider, and neither a lookup nor the
    #: provider's key keeps the resend from being a second message
    second_copy_possible: bool


class DeliveryPage(BaseModel):
    """A page of deliveries, oldest first; pass ``next_cursor`` as ``cursor`` for the next."""

    items: list[DeliveryOut]
    next_cursor: str | None = Field(description="null on the last page.")


class DeadLetters(BaseModel):
    items: list[DeliveryOut]


class TimelineEvent(BaseModel):
    at: StrTime
    action: str = Field(
        description="enqueued, provider_request, provider_response, claim_taken_over, "
        "status_write, job_state, lease_held, lease_expired, claim_expired…"
    )
    line: str = Field(description="The event as a log line (`time key=value …`).")
    warn: bool = Field(description="A sign of a race: overlapping requests, a late answer…")


class Timeline(BaseModel):
    notification_id: int
    events: list[TimelineEvent]


class Health(BaseModel):
    status: Literal["ok", "ready"]


#: a callback's ``at`` as epoch seconds: from 1970 to the year 9999
Epoch = Annotated[float, Field(ge=0, le=253402300799, allow_inf_nan=False)]


class CallbackIn(BaseModel):
    """A provider's delivery callback (``POST /v1/callbacks/{channel}``)."""

    model_config = ConfigDict(extra="forbid", strict=True, title="DeliveryCallback")

    message_id: MessageId = Field(
        description="The provider's id of its message (at most 1000 bytes)."
    )
    status: Literal["delivered", "bounced", "failed"] = Field(
        description="`delivered`: it reached the user; `bounced`: it was refused on the "
        "way; `failed`: the provider, having accepted it, could not deliver it."
    )
    key: Key | None = Field(
        default=None,
        description="The idempotency key the provider was given (`Idempotency-Key`, "
        "`webhook-id`): finds the delivery when kirim never learned the message id.",
    )
    reason: ReasonText | None = Field(default=None, description="The provider's words, if any.")
    at: Epoch | When | None = Field(
        default=None,
        description="When it happened: epoch seconds, or ISO-8601 with a timezone.",
    )


class CallbackOut(BaseModel):
    """What a callback did (200), or that no delivery has its message id (202)."""

    outcome: Literal["applied", "recorded", "repeated", "unknown"]
    notification_id: int | None = None
    status: DeliveryStatus | None = None
    previous_status: DeliveryStatus | None = None
    duplicate: bool = False
    #: 202: the callback is kept, and applied once kirim records its message (a
    #: callback that overtook the provider's answer to the request)
    kept: bool = False


# -- recipients' preferences (/v1/recipients/{recipient_id}/preferences) --------------

#: a local time of day, 24-hour ``HH:MM``
ClockTime = Annotated[str, StringConstraints(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]


class WindowJson(BaseModel):
    """A daily span of the recipient's local time (over midnight when `end` is earlier)."""

    model_config = ConfigDict(extra="forbid")

    start: ClockTime = Field(description="HH:MM, such as 22:00.")
    end: ClockTime = Field(description="HH:MM, such as 07:00 (not equal to start).")


class PreferencesIn(BaseModel):
    """A recipient's preferences, all of them (a field left out is reset to its default).

    Only documents the body: the route checks it with ``kirim.preferences``, the rules
    of the CLI and the Python API."""

    model_config = ConfigDict(extra="forbid", title="PreferencesIn")

    opt_out: bool = Field(
        default=False, description="Opted out of everything (critical types still go)."
    )
    channels: dict[str, bool] = Field(
        default_factory=dict,
        description='On or off per `"type:channel"`, `"type:*"` or `"*:channel"` (the most '
        "specific wins, and beats the type's own default).",
    )
    timezone: str | None = Field(
        default=None,
        max_length=64,
        description="An IANA time zone (`Asia/Jakarta`) for the quiet hours and the types' "
        "send windows; null: UTC.",
    )
    quiet_hours: WindowJson | None = Field(
        default=None,
        description="Nothing but critical types is sent then: deliveries wait for the end.",
    )


class PreferencesOut(BaseModel):
    """A recipient's preferences as stored."""

    recipient_id: str
    opt_out: bool
    channels: dict[str, bool]
    timezone: str | None
    quiet_hours: WindowJson | None
    updated_at: StrTime | None


RecipientName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=limits.RECIPIENT_ID.bytes),
    AfterValidator(fits(limits.RECIPIENT_ID)),
]


class RecipientIn(BaseModel):
    """A recipient with its locale and its address on each channel."""

    model_config = ConfigDict(extra="forbid", strict=True, title="EventRecipient")

    id: RecipientName = Field(description="Whose preferences and throttle rule it.")
    locale: Annotated[str, StringConstraints(min_length=1, max_length=35)] | None = Field(
        default=None, description="The locale its messages are written in (`id`, `pt_BR`)."
    )
    to: dict[ChannelName, Address] = Field(
        default_factory=dict,
        description="Its address on each channel (absent: the id).",
    )


class EventIn(BaseModel):
    """One event of a notification type (``POST /v1/events``)."""

    model_config = ConfigDict(extra="forbid", strict=True, title="NewEvent")

    type: ChannelName = Field(description="A notification type configured on the server.")
    recipients: list[RecipientName | RecipientIn] = Field(
        min_length=1,
        max_length=1000,
        description="Recipient ids, or recipients with a locale and addresses.",
    )
    data: dict[str, Any] = Field(description="The templates' variables.")
    event_id: EventId | None = Field(
        default=None,
        description="The business event's id (each delivery's key comes from it). "
        "Default: the `Idempotency-Key` header.",
    )

    def as_call(self) -> dict[str, Any]:
        """The arguments of ``Kirim.prepare_event``."""
        recipients = [
            r if isinstance(r, str) else {"id": r.id, "locale": r.locale, "to": r.to}
            for r in self.recipients
        ]
        return {
            "type": self.type,
            "recipients": recipients,
            "data": self.data,
            "event_id": self.event_id,
        }


class EventDeliveryOut(BaseModel):
    """What became of the event for one recipient on one channel."""

    recipient_id: str
    channel: str
    delivery_id: int
    idempotency_key: str
    created: bool
    status: DeliveryStatus
    reason: Reason | None = Field(description="Why it is suppressed.")
    run_at: StrTime | None = Field(
        description="When it is due (ISO-8601 UTC), if later: a send window, a "
        "throttle's next window, or the end of its digest's window."
    )
    digest: str | None = Field(description="The digest stream it went into.")


class EventRunOut(BaseModel):
    """The workflow run an event of a type with steps started for one recipient."""

    recipient_id: str
    run_id: int
    key: str
    created: bool
    status: str


class EventOut(BaseModel):
    """The deliveries one event made (or had made before); a workflow type's event:
    its runs instead (``deliveries`` empty)."""

    type: str
    event_id: str
    deliveries: list[EventDeliveryOut]
    runs: list[EventRunOut] | None = Field(
        default=None, description="A workflow type's runs, one per recipient."
    )
    canceled_runs: list[int] | None = Field(
        default=None,
        description="The runs this event canceled (a type's cancel_on), in its transaction.",
    )


class AddressOut(BaseModel):
    """One address of a recipient on a channel (``kirim.addresses``)."""

    recipient_id: str
    channel: str
    address: str
    label: str | None
    added_at: StrTime | None
    retired: bool
    retired_at: StrTime | None
    retired_reason: str | None


class AddressesOut(BaseModel):
    """Every address of a recipient, retired ones too."""

    recipient_id: str
    addresses: list[AddressOut]


class SubscriptionOut(BaseModel):
    """One recipient's subscription to a topic (``kirim.topics``)."""

    topic: str
    recipient_id: str
    added_seq: int
    added_at: StrTime | None
    removed_seq: int | None
    removed_at: StrTime | None
    created: bool


class TopicEventOut(BaseModel):
    """An event to a topic and how far its fan-out got."""

    id: int
    topic: str
    type: str
    event_id: str
    mark: int
    status: Literal["expanding", "done"]
    cursor: str | None
    batches: int
    recipients: int
    created_at: StrTime | None
    finished_at: StrTime | None
    #: when a cancellation of the type's runs (its ``cancel_on``) reached the fan-out
    #: under way, and why: its later batches start their runs canceled
    canceled_at: StrTime | None = None
    cancel_why: str | None = None
    created: bool


class TopicOut(BaseModel):
    """A topic: its subscribers now and its latest fan-outs."""

    topic: str
    seq: int
    subscribers: int
    created_at: StrTime | None
    recent: list[TopicEventOut]


class TopicsOut(BaseModel):
    """Topics by name."""

    topics: list[TopicOut]


class SubscribersOut(BaseModel):
    """A page of a topic's subscribers, by recipient id."""

    topic: str
    subscribers: list[str]
    #: the ``after`` of the next page (None: this is the last)
    next: str | None


class TopicEventIn(BaseModel):
    """An event of a notification type to everyone subscribed to the topic."""

    model_config = ConfigDict(extra="forbid", strict=True, title="TopicEventIn")

    type: Annotated[str, StringConstraints(min_length=1, max_length=limits.TYPE.bytes)]
    event_id: Annotated[str, StringConstraints(min_length=1, max_length=limits.EVENT_ID.bytes)]
    data: dict[str, Any] = Field(default_factory=dict)


class AddressIn(BaseModel):
    """An address to add: checked as the channel's provider takes it."""

    model_config = ConfigDict(extra="forbid", strict=True, title="AddressIn")

    channel: Annotated[str, StringConstraints(min_length=1, max_length=limits.CHANNEL.bytes)]
    address: Annotated[str, StringConstraints(min_length=1, max_length=limits.RECIPIENT.bytes)] = (
        Field(description="A device token, an E.164 phone, a subscription's JSON, an email...")
    )
    label: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
