"""The fan-out of one event: a delivery per recipient x channel, planned without I/O.

``prepare`` checks the event (type, recipients, data) and renders every template, so
that a template error or a missing variable is raised before anything is read or
written. ``plan`` turns the rendered event and the recipients' preferences into the
``NewDelivery`` list that one ``store.enqueue`` records in one transaction:

- preferences suppress (``suppressed`` with the reason) or defer (``run_at`` at the
  send window's opening), per ``kirim.preferences.decide``;
- a throttled type's deliveries carry a ``Throttle`` whose scope names the channel
  and the recipient: ``recipient:u1:email``, ``type:order_shipped:u1:email``,
  ``key:order_shipped:<value>:u1:email`` (``%`` and ``:`` in a part written ``%25``
  and ``%3A``);
- a digest type's deliveries carry a ``DigestEvent`` for the stream
  ``type|recipient|channel|keyvalue`` (``|`` written ``%7C``), with a placeholder
  payload that ``compose_digest`` replaces when the digest is sealed.

A recipient with addresses on a channel (``kirim.addresses``) gets one delivery per
address not retired, its key ``device_key(event_id, recipient_id, channel, address)``,
its digest stream and throttle scope those of the recipient's device
(``u1#<tag>``); one with none on a channel that needs one, a ``suppressed``
delivery (``no_address``).

Each delivery's key is ``default_key(event_id, recipient_id, channel)``; a digest's
delivery gets its key from the store (derived from stream and window). The
payloads are rendered by ``kirim.notify.messages``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kirim import limits
from kirim.addresses import Address
from kirim.errors import InvalidNotification, PayloadTooLarge, UnknownChannel
from kirim.keys import canonical_json, default_key, device_key, device_tag, payload_hash
from kirim.model import DeliveryStatus, Doubt, EnqueueResult
from kirim.notify import sandbox
from kirim.notify.messages import check_data, digest_context, render_channel
from kirim.notify.steps import digest_of
from kirim.notify.templates import normalize_locale
from kirim.notify.types import NotificationType
from kirim.preferences import Preferences, Reason, Verdict, decide
from kirim.store.base import DigestEvent, NewDelivery, Throttle
from kirim.validation import BadValue, check_text, shown
from kirim.views import iso

if TYPE_CHECKING:
    from kirim.runs import EventRun
    from kirim.store.flows import Canceled

#: the most deliveries (recipients x channels) one event fans out to
MAX_DELIVERIES = 10_000
#: the most bytes one event renders in all (every delivery's payload): what one request
#: may write, so that it cannot hold the database's writer for long (4 MiB take about
#: a tenth of a second to record on SQLite and PostgreSQL)
MAX_EVENT_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Recipient:
    """Who an event goes to: ``id`` (whose preferences and throttle rule it), the
    ``locale`` its messages are written in (None: the type's default), and ``to``:
    its address on each channel (absent: the id)."""

    id: str
    locale: str | None = None
    to: Mapping[str, str] = field(default_factory=dict)

    def address(self, channel: str) -> str:
        return self.to.get(channel, self.id)


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """An event checked and rendered (``prepare``): what ``plan`` needs."""

    type: NotificationType
    event_id: str
    data: Mapping[str, Any]
    data_json: str
    recipients: tuple[Recipient, ...]
    #: (recipient id, channel) -> the rendered payload's JSON text (a digest type's:
    #: the event alone, as its digest would show it)
    rendered: Mapping[tuple[str, str], str]
    #: ... -> a digest type's placeholder payload (until the digest is sealed)
    placeholders: Mapping[tuple[str, str], str] = field(default_factory=dict)

    @property
    def recipient_ids(self) -> list[str]:
        return [r.id for r in self.recipients]


@dataclass(frozen=True, slots=True, kw_only=True)
class Planned:
    """One delivery of the event as planned, with the verdict of preferences."""

    recipient_id: str
    channel: str
    delivery: NewDelivery
    verdict: Verdict
    #: the address of a fan-out to the recipient's addresses (None: not one)
    device: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EventDelivery:
    """What became of one recipient x channel (``notify_event``'s result)."""

    recipient_id: str
    channel: str
    delivery_id: int
    idempotency_key: str
    created: bool
    status: DeliveryStatus
    #: why it is suppressed (``kirim.preferences.Reason``)
    reason: str | None = None
    #: when its job is due, if later than the enqueue: deferred by a send window or
    #: a throttle, or a digest waiting for its window's end
    run_at: float | None = None
    #: the digest stream it went into (the delivery is the digest's)
    digest: str | None = None
    pruned: bool = False
    #: the doubt kirim has about it (``assumed_sent``, ``held``, ``resolved``), a pruned
    #: delivery's too
    doubt: Doubt | None = None
    #: the recipient's address it goes to, when it is one of a fan-out to its addresses
    address: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "recipient_id": self.recipient_id,
            "channel": self.channel,
            "delivery_id": self.delivery_id,
            "idempotency_key": self.idempotency_key,
            "created": self.created,
            "status": str(self.status),
            "reason": self.reason,
            "run_at": iso(self.run_at),  # ISO-8601 UTC, as every time kirim shows
            "digest": self.digest,
            "doubt": None if self.doubt is None else str(self.doubt),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class EventResult:
    """``notify_event``'s answer: one entry per recipient x channel, in that order."""

    type: str
    event_id: str
    deliveries: tuple[EventDelivery, ...]
    #: a workflow type's event: one run per recipient instead (``kirim.workflows``)
    runs: tuple[EventRun, ...] = ()
    #: the runs this event canceled (a type's ``cancel_on``), in the event's transaction
    canceled: tuple[Canceled, ...] = ()

    @property
    def canceled_runs(self) -> tuple[int, ...]:
        """The ids of the runs this event canceled."""
        return tuple(c.run.id for c in self.canceled)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.type,
            "event_id": self.event_id,
            "deliveries": [d.to_json() for d in self.deliveries],
        }
        if self.runs:
            out["runs"] = [r.to_json() for r in self.runs]
        if self.canceled_runs:
            out["canceled_runs"] = list(self.canceled_runs)
        return out


# -- checking and rendering ------------------------------------------------------------


def recipients_of(value: Any) -> tuple[Recipient, ...]:
    """A list of recipients (ids, mappings ``{"id", "locale", "to"}`` or ``Recipient``;
    one alone is a list of one), checked; the same recipient twice counts once."""
    items = [value] if isinstance(value, str | Recipient) else value
    if not isinstance(items, list | tuple) or not items:
        raise InvalidNotification("recipients must be a non-empty list of recipients")
    found: dict[str, Recipient] = {}
    for i, item in enumerate(items):
        recipient = _recipient(item, f"recipients[{i}]")
        if found.setdefault(recipient.id, recipient) != recipient:
            raise InvalidNotification(
                f"recipients[{i}]: recipient {recipient.id!r} is listed twice, differently"
            )
    return tuple(found.values())


def _recipient(item: Any, where: str) -> Recipient:
    if isinstance(item, int) and not isinstance(item, bool):
        item = str(item)
    rid: Any
    locale: Any
    to: Any
    if isinstance(item, str):
        rid, locale, to = item, None, {}
    elif isinstance(item, Recipient):
        rid, locale, to = item.id, item.locale, item.to
    elif isinstance(item, Mapping):
        bad = sorted(str(k) for k in set(item) - {"id", "locale", "to"})
        if bad:
            raise InvalidNotification(f"{where}: unknown key(s) {', '.join(bad)}")
        rid, locale, to = item.get("id"), item.get("locale"), item.get("to", {})
    else:
        raise InvalidNotification(f"{where} must be an id, a mapping or a Recipient")
    if not isinstance(to, Mapping):
        raise InvalidNotification(f"{where}.to must map channels to addresses")
    try:
        rid = check_text(f"{where}.id", rid, limit=limits.RECIPIENT_ID)
        addresses = {
            check_text(f"{where}.to", ch, limit=limits.CHANNEL): check_text(
                f"{where}.to.{ch}", a, limit=limits.RECIPIENT
            )
            for ch, a in to.items()
        }
        if locale is not None:
            locale = normalize_locale(locale)
    except BadValue as exc:
        raise InvalidNotification(str(exc)) from None
    except ValueError as exc:
        raise InvalidNotification(f"{where}.locale: {exc}") from None
    return Recipient(rid, locale, addresses)


def prepare(
    ntype: NotificationType,
    recipients: Any,
    data: Any,
    *,
    event_id: Any,
    channels: Collection[str],
    max_payload_bytes: int,
) -> Event:
    """Check the event and render every recipient x channel; raises
    ``InvalidNotification`` (``RenderError``, ``UnknownChannel``, ``PayloadTooLarge``)
    before anything is read or written."""
    try:
        as_text = isinstance(event_id, int) and not isinstance(event_id, bool)
        event = check_text(
            "event_id", str(event_id) if as_text else event_id, limit=limits.EVENT_ID
        )
    except BadValue as exc:
        raise InvalidNotification(str(exc)) from None
    missing = [ch for ch in ntype.channels if ch not in channels]
    if missing:
        known = ", ".join(sorted(channels)) or "none configured"
        raise UnknownChannel(
            f"type {ntype.name!r} names unknown channel {missing[0]!r} (known: {known})"
        )
    who = recipients_of(recipients)
    if len(who) * len(ntype.channels) > MAX_DELIVERIES:
        raise InvalidNotification(f"one event fans out to at most {MAX_DELIVERIES} deliveries")
    data_json = check_data(data, max_bytes=max_payload_bytes)
    digest = ntype.digest
    if digest is not None and digest.key != "recipient":
        _field(ntype, data, digest.key)  # the data has the field it is grouped by
    if ntype.throttle is not None and ntype.throttle.key is not None:
        _field(ntype, data, ntype.throttle.key)
    context = digest_context([data]) if digest is not None else data
    gathers = digest_of(ntype.steps)
    if gathers is not None:  # a digest step: its later sends see events and count
        if gathers.key != "recipient":
            _field(ntype, data, gathers.key)  # the data has the field it is gathered by
        context = {**data, **digest_context([data])}
    rendered: dict[tuple[str, str], str] = {}
    placeholders: dict[tuple[str, str], str] = {}
    total = 0
    with sandbox.limited(sandbox.Budget()):  # one budget for all of the event's renders
        for r in who:
            for channel in ntype.channels:
                _check_streams(ntype, r.id, channel, data)
                payload = render_channel(ntype, channel, context, locale=r.locale, recipient=r.id)
                text = rendered[(r.id, channel)] = _sized(payload, max_payload_bytes)
                total += len(text)
                if total > MAX_EVENT_BYTES:
                    raise PayloadTooLarge(
                        f"the event renders more than {MAX_EVENT_BYTES} bytes for its "
                        f"{len(who) * len(ntype.channels)} deliveries (the limit of one event): "
                        "send it to fewer recipients at a time"
                    )
                if digest is not None:
                    placeholders[(r.id, channel)] = canonical_json(
                        {
                            "type": ntype.name,
                            "locale": r.locale or ntype.default_locale,
                            "digest": stream(ntype, r.id, channel, data),
                            "events": [],
                        }
                    )
    return Event(
        type=ntype,
        event_id=event,
        data=data,
        data_json=data_json,
        recipients=who,
        rendered=rendered,
        placeholders=placeholders,
    )


def _sized(payload: dict[str, Any], limit: int) -> str:
    text = canonical_json(payload)
    size = len(text)  # canonical JSON is ASCII (every other character is escaped)
    if size > limit:
        raise PayloadTooLarge(f"the rendered payload is {size} bytes, over the limit of {limit}")
    return text


def _field(ntype: NotificationType, data: Mapping[str, Any], name: str) -> str:
    """The value of the data field a digest or throttle groups by, as text (at most
    ``kirim.limits.GROUP`` bytes: it is part of an indexed stream or scope)."""
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise InvalidNotification(
            f"type {ntype.name!r} groups by data field {name!r}: the data needs it "
            "(a non-empty string or an integer)"
        )
    try:
        return check_text(f"data.{name}", str(value), limit=limits.GROUP)
    except BadValue as exc:
        raise InvalidNotification(str(exc)) from None


def _check_streams(
    ntype: NotificationType, recipient_id: str, channel: str, data: Mapping[str, Any]
) -> None:
    """The digest stream and throttle scope of one recipient x channel within
    ``kirim.limits.STREAM`` bytes (each ``%``, ``:`` and ``|`` is written in three)."""
    made = []
    if ntype.digest is not None:
        made.append(("digest stream", ntype.digest.key, stream(ntype, recipient_id, channel, data)))
    if ntype.throttle is not None:
        key = ntype.throttle.key or "recipient"
        made.append(("throttle scope", key, throttle_scope(ntype, recipient_id, channel, data)))
    for what, key, text in made:
        if (problem := limits.STREAM.problem(text)) is not None:
            field = "recipient id" if key == "recipient" else f"data.{key}"
            raise InvalidNotification(
                f"{field} makes the {what} of recipient {shown(recipient_id)} too long: it "
                f"{problem} (a shorter value, or fewer '%', ':' and '|' in it)"
            )


def _escaped(part: str, *also: str) -> str:
    text = part.replace("%", "%25")
    for c in also:
        text = text.replace(c, f"%{ord(c):02X}")
    return text


def stream(
    ntype: NotificationType, recipient_id: str, channel: str, data: Mapping[str, Any]
) -> str:
    """The digest stream of one recipient x channel: ``type|recipient|channel|keyvalue``."""
    assert ntype.digest is not None
    key = ntype.digest.key
    value = "" if key == "recipient" else _field(ntype, data, key)
    return "|".join(_escaped(p, "|") for p in (ntype.name, recipient_id, channel, value))


def throttle_scope(
    ntype: NotificationType, recipient_id: str, channel: str, data: Mapping[str, Any]
) -> str:
    """The throttle's counter of one recipient x channel (see the module's docstring)."""
    rule = ntype.throttle
    assert rule is not None
    head: tuple[str, ...] = ("recipient",)
    if rule.per == "type":
        head = ("type", ntype.name)
    elif rule.per == "key":
        head = ("key", ntype.name, _field(ntype, data, rule.key or ""))
    return ":".join(_escaped(p, ":") for p in (*head, recipient_id, channel))


# -- planning --------------------------------------------------------------------------


def targets(
    r: Recipient, channel: str, addresses: Sequence[Address], needed: bool
) -> list[tuple[str, str | None]]:
    """Where one recipient's delivery on ``channel`` goes: (address, device), device
    being the address when the delivery is one of several of a fan-out to the
    recipient's addresses (None: the one delivery of the recipient on the channel).
    None at all: the channel needs an address and the recipient has none."""
    if channel in r.to:
        return [(r.to[channel], None)]
    mine = [a.address for a in addresses if a.channel == channel and not a.retired]
    if mine:
        return [(a, a) for a in mine]
    return [] if needed else [(r.id, None)]


def _unit(recipient_id: str, device: str | None) -> str:
    """The recipient part of a stream or throttle scope: a device's own, per device."""
    return recipient_id if device is None else f"{recipient_id}#{device_tag(device)}"


def plan(
    event: Event,
    prefs: Mapping[str, Preferences],
    *,
    now: float,
    max_attempts: int,
    addresses: Mapping[str, Sequence[Address]] | None = None,
    needs_address: Collection[str] = (),
) -> list[Planned]:
    """The deliveries to record, recipient by recipient, channel by channel, address by
    address (``kirim.addresses``: a device of a fan-out is a delivery of its own, its
    key, digest stream and throttle scope its own)."""
    ntype = event.type
    policy = ntype.policy
    out = []
    for r in event.recipients:
        for channel in ntype.channels:
            verdict = decide(policy, channel, prefs.get(r.id), now)
            places = targets(r, channel, (addresses or {}).get(r.id, ()), channel in needs_address)
            if not places:  # nothing to send to: recorded, suppressed, never sent
                verdict = Verdict(action="suppress", reason=Reason.NO_ADDRESS)
                places = [(r.id, None)]
            for address, device in places:
                out.append(_planned(event, r, channel, verdict, address, device, now, max_attempts))
    return out


def _planned(
    event: Event,
    r: Recipient,
    channel: str,
    verdict: Verdict,
    address: str,
    device: str | None,
    now: float,
    max_attempts: int,
) -> Planned:
    ntype = event.type
    unit = _unit(r.id, device)
    text = event.rendered[(r.id, channel)]
    digest = throttle = None
    run_at = None
    suppressed = None
    if verdict.action == "suppress":
        suppressed = str(verdict.reason)
    elif ntype.digest is not None:
        # the digest waits for its window; the claim-time check defers it further
        text = event.placeholders[(r.id, channel)]
        digest = DigestEvent(
            stream=stream(ntype, unit, channel, event.data),
            window=ntype.digest.window,
            event_id=event.event_id,
            data_json=event.data_json,
        )
    else:
        run_at = verdict.until if verdict.action == "defer" else None
        if ntype.throttle is not None:
            throttle = Throttle(
                scope=throttle_scope(ntype, unit, channel, event.data),
                limit=ntype.throttle.limit,
                window=ntype.throttle.window,
                over=ntype.throttle.over,
            )
    key = (
        default_key(event.event_id, r.id, channel)
        if device is None
        else device_key(event.event_id, r.id, channel, device)
    )
    delivery = NewDelivery(
        idempotency_key=key,
        event_id=event.event_id,
        recipient=address,
        channel=channel,
        payload_json=text,
        payload_hash=payload_hash(text),
        run_at=run_at,
        max_attempts=max_attempts,
        type=ntype.name,
        recipient_id=r.id,
        suppressed=suppressed,
        throttle=throttle,
        digest=digest,
    )
    return Planned(
        recipient_id=r.id, channel=channel, delivery=delivery, verdict=verdict, device=device
    )


def outcome(planned: Planned, result: EnqueueResult, *, now: float) -> EventDelivery:
    """What the store made of one planned delivery."""
    d = result.delivery
    run_at = None
    if result.job is not None and result.job.run_at > now and not d.status.at_rest:
        run_at = result.job.run_at
    digest = planned.delivery.digest
    return EventDelivery(
        recipient_id=planned.recipient_id,
        channel=planned.channel,
        delivery_id=d.id,
        idempotency_key=d.idempotency_key,
        created=result.created,
        status=d.status,
        reason=d.reason,
        run_at=run_at,
        digest=None if digest is None or d.status == DeliveryStatus.SUPPRESSED else digest.stream,
        pruned=result.pruned,
        doubt=d.doubt,
        address=planned.device,
    )
