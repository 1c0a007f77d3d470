"""The whole configuration of a ``full`` schedule, drawn per seed (``World.draw``).

Everything a user can write into kirim.toml or pass to the library, and every
operator action, is drawn here, so that the explorer checks each feature under its
faults and not beside them (``kirim.explore.coverage`` fails the suite when a knob
of ``Channel``, ``NotificationType``, ``Preferences`` or ``WorkerSettings`` is drawn
by no seed):

- 1 to 3 channels, each with its own provider model (``ProviderModel``): honours
  keys or not, with or without a dedup window, can be asked (``lookup``, with a lag)
  or not, an in-doubt policy, failure classes (``retry_on``, ``ambiguous_on``,
  ``permanent_on``) that match what the provider's answers mean, a fallback chain, a
  request rate, a timeout of its own or the worker's, and delivery callbacks
  (delivered, bounced; early, late, repeated, carrying the key or not);
- 0 to 3 notification types with templates, on some of the channels: critical or
  not, defaults per channel, a send window, a throttle (suppress or defer, per
  recipient, type or data key) or a digest (per recipient or data key);
- 2 or 3 recipients, each with a time zone, preferences (opt-out, channel choices,
  quiet hours) set before the run, and changes of them at seeded times (a new
  document, or deleted);
- the time of day: the run starts a few seconds before a boundary that matters (the
  end of quiet hours, the opening of a type's window, a DST transition of a
  recipient's zone), so windows open and clocks change while it runs;
- the workers: their settings (lease, concurrency, batches, polling, heartbeat,
  reaper, backoff, grace, request timeout, margins, retention), and per worker
  whether it knows the types (a rolling upgrade, or a worker without ``[types]``)
  and all the channels;
- the operator: retries of dead letters, cancels, reconciles, prunes, at seeded times;
- topics (``kirim.explore.topics``): subscriptions changing around and during the
  fan-outs of events to a topic, some given again;
- which channels are the in-app inbox (no provider: the message is a row of kirim's
  own, written in the commit that marks it sent), and how long archived feed messages
  are kept.

The world is plain data derived from the seed (nothing of it is saved apart from the
seed); ``channels``, ``types`` and ``worker_settings`` build the real kirim objects.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from kirim.explore import topics as topic_plans
from kirim.notify import NotificationType, parse_type
from kirim.preferences import Preferences, Window
from kirim.worker.settings import WorkerSettings

#: recipients' zones: without DST, with DST at 02:00 (US, EU at 01:00 UTC), half an
#: hour's DST (Lord Howe), an offset of +05:45
ZONES = (
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Asia/Jakarta",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
)
#: the channels' names, in the order they are made
CHANNEL_NAMES = ("push", "email", "sms")
TYPE_NAMES = ("alert", "news", "bundle")
#: what a provider's HTTP 503 means, and so what a careful user writes: "ambiguous"
#: (it may have acted; the default class), "retry" (it never did: ``retry_on``),
#: "permanent" (it refuses for good: ``permanent_on``)
Meaning503 = Literal["ambiguous", "retry", "permanent"]
#: what its 400 means: "permanent" (the default class), or "ambiguous" (a batch API
#: that may have sent before it refused: ``ambiguous_on``)
Meaning400 = Literal["permanent", "ambiguous"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelPlan:
    name: str
    idempotent: bool
    #: the provider can be asked (``lookup``), and the channel asks it
    lookup: bool
    on_unknown: str
    #: seconds the provider remembers a key (None: for good); only with ``idempotent``
    dedup_window: float | None
    fallback: tuple[str, ...]
    rate: float | None
    #: the provider posts delivered / bounced callbacks to kirim
    callbacks: bool
    #: its callbacks carry the idempotency key (some providers echo metadata)
    callback_key: bool
    #: the share of accepted messages that bounce
    bounce: float
    #: the provider's own client timeout (None: the worker's ``request_timeout``)
    timeout: float | None
    lookup_lag: float
    meaning_503: Meaning503
    meaning_400: Meaning400
    #: the provider collapses on the device (APNs apns-collapse-id, FCM tag, Web Push
    #: Topic): a resend with the key's collapse id replaces the notification the device
    #: shows, for ``collapse_window`` seconds after it was shown (None: for good); the
    #: server itself keeps no key (``idempotent`` is then False)
    collapse: bool = False
    collapse_window: float | None = None
    #: the channel's recipients have device addresses (``kirim.addresses``): an event
    #: fans out to each, and the provider calls some of them dead
    devices: bool = False
    #: the in-app inbox (``provider = "inbox"``): no provider model, no request; the
    #: message is written into the recipient's feed in the commit that marks it sent
    inbox: bool = False
    #: the operator's configuration asks the provider (``lookup``) where the workers'
    #: does not: lookup turned on after deliveries were held or assumed sent, so that
    #: ``kirim reconcile`` can settle them (the workers never ask)
    operator_lookup: bool = False

    def classes(self) -> dict[str, list[int]]:
        """``retry_on`` / ``ambiguous_on`` / ``permanent_on`` as a careful user writes
        them for this provider."""
        out: dict[str, list[int]] = {}
        if self.meaning_503 == "retry":
            out["retry_on"] = [503]
        elif self.meaning_503 == "permanent":
            out["permanent_on"] = [503]
        if self.meaning_400 == "ambiguous":
            out["ambiguous_on"] = [400]
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class AddressPlan:
    """A device address a recipient has on a channel before the run; ``dead``: the
    provider answers ``DeadAddress`` for it (APNs 410 Unregistered)."""

    recipient: str
    channel: str
    address: str
    dead: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class TypePlan:
    """A notification type as its kirim.toml table (``table``), built by ``parse_type``."""

    name: str
    table: dict[str, Any]

    def build(self) -> NotificationType:
        return parse_type(self.name, self.table)


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefsChange:
    """At ``at``, ``recipient``'s preferences become ``prefs`` (None: deleted)."""

    at: float
    recipient: str
    prefs: Preferences | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Send:
    """One thing the application does: an event of a type, or a plain ``notify``."""

    at: float
    event_id: str
    type: str | None  # None: notify(event_id, recipient, channel, payload)
    recipients: tuple[str, ...]
    channel: str  # the channel of a plain notify ("" for an event)
    data: dict[str, Any]


ActionKind = Literal["retry", "cancel", "reconcile", "prune"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """An operator's action at ``at``: ``retry`` (every dead letter), ``cancel`` /
    ``reconcile`` (the ``target``-th delivery made), ``prune`` (one batch)."""

    at: float
    kind: ActionKind
    target: int = 0


#: what a recipient does to a message of their inbox (``kirim.inbox.FeedAction``), or
#: ``delete`` it, or ``mark_all_read``
FEED_VERBS = ("seen", "read", "unread", "archive", "unarchive", "delete", "mark_all_read")


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedAct:
    """A recipient's action on their inbox at ``at``: ``verb`` on the message at
    ``pick`` (a fraction) of their feed, newest first."""

    at: float
    recipient: str
    verb: str
    pick: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamPlan:
    """A browser following ``recipient``'s feed live (``kirim.live``): a stream open
    over each of ``sessions`` (virtual times), each after the first resuming from the
    last event id the one before had."""

    recipient: str
    sessions: tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerPlan:
    settings: WorkerSettings
    #: the worker knows the notification types (their policies and digests)
    types: bool = True
    #: the channels it has (None: every one)
    channels: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class World:
    seed: int
    #: epoch seconds at virtual time 0
    base: float
    #: why the run starts when it does (the boundary it approaches)
    anchor: str
    channels: tuple[ChannelPlan, ...]
    types: tuple[TypePlan, ...]
    recipients: tuple[str, ...]
    zones: dict[str, str]
    prefs: tuple[PrefsChange, ...]
    sends: tuple[Send, ...]
    actions: tuple[Action, ...]
    workers: tuple[WorkerPlan, ...]
    max_attempts: int
    #: ``[retention] keys`` for the operator's prunes (the workers' settings have theirs)
    keys: float = 3600.0
    notes: dict[str, Any] = field(default_factory=dict)
    #: the recipients' device addresses (``ChannelPlan.devices``)
    addresses: tuple[AddressPlan, ...] = ()
    #: the recipients' actions on their inbox, and the browsers that follow it live
    feed_acts: tuple[FeedAct, ...] = ()
    streams: tuple[StreamPlan, ...] = ()
    #: the topic workload (``kirim.explore.topics``; None: this world has none)
    topics: topic_plans.TopicsPlan | None = None

    # -- drawing -----------------------------------------------------------------------

    @staticmethod
    def draw(seed: int, *, workers: int = 3) -> World:
        rng = random.Random(f"world:{seed}")
        channels = _channels(rng)
        names = [c.name for c in channels]
        people = tuple(f"u{i}" for i in range(1, rng.choice((2, 3, 3)) + 1))
        zones = {p: rng.choice(ZONES) for p in people}
        base, anchor, clock = _start(rng, zones[people[0]])
        types = _types(rng, names, clock)
        prefs = _preferences(rng, people, zones, clock, [t.name for t in types], names)
        sends = _sends(rng, types, people, names)
        made = sum(max(1, len(s.recipients)) for s in sends)
        actions = _actions(rng, made)
        max_attempts = rng.choice((2, 3, 3, 5))
        keys = rng.choice((0.0, 3600.0, 365 * 86400.0))
        settings = _settings(rng)
        plans: list[WorkerPlan] = []
        for i in range(workers):  # last: a schedule shrunk to fewer workers keeps the rest
            own = settings
            if rng.random() < 0.2:  # a worker with another lease (a config being rolled out)
                own = _settings(rng, lease=rng.choice((6.0, 10.0, 15.0)))
            knows = not (types and i == workers - 1 and rng.random() < 0.3)
            if not knows and plans and plans[0].channels is not None and workers == 2:
                # one worker at least is whole (every type, every channel): the one that
                # expands topic events (with three, the middle one always is)
                knows = True
            has: tuple[str, ...] | None = None
            if len(names) > 1 and i == 0 and rng.random() < 0.15:
                has = tuple(names[:-1])  # a worker without the last channel
            plans.append(WorkerPlan(settings=own, types=knows, channels=has))
        channels, addresses = _devices(seed, channels, people)
        channels, plans = _inbox(seed, channels, plans)
        channels = _operator_lookup(seed, channels)
        boxes = {c.name for c in channels if c.inbox}
        addresses = [a for a in addresses if a.channel not in boxes]
        last_send = max((s.at for s in sends), default=0.0)
        feed_acts, streams = _readers(seed, bool(boxes), people, last_send)
        topics = topic_plans.draw(seed, types, people)
        if topics is not None and topics.flow is not None:  # the topic workload's own
            types = [*types, TypePlan(name=topic_plans.FLOW, table=topics.flow)]
        return World(
            seed=seed,
            base=base,
            anchor=anchor,
            channels=tuple(channels),
            addresses=tuple(addresses),
            types=tuple(types),
            recipients=people,
            zones=zones,
            prefs=tuple(prefs),
            sends=tuple(sends),
            actions=tuple(actions),
            workers=tuple(plans),
            max_attempts=max_attempts,
            keys=keys,
            feed_acts=tuple(feed_acts),
            streams=tuple(streams),
            topics=topics,
        )

    # -- building ----------------------------------------------------------------------

    def channel(self, name: str) -> ChannelPlan:
        return next(c for c in self.channels if c.name == name)

    def notification_types(self) -> list[NotificationType]:
        return [t.build() for t in self.types]

    def notification_type(self, name: str) -> NotificationType:
        return next(t.build() for t in self.types if t.name == name)

    def type_plan(self, name: str | None) -> TypePlan | None:
        return next((t for t in self.types if t.name == name), None)


# -- the parts ---------------------------------------------------------------------------


def _channels(rng: random.Random) -> list[ChannelPlan]:
    count = rng.choice((1, 1, 2, 2, 3))
    names = CHANNEL_NAMES[:count]
    out = []
    for i, name in enumerate(names):
        idempotent = rng.random() < 0.4
        lookup = rng.random() < 0.3
        window = rng.choice((None, 8.0, 15.0, 30.0, 90.0)) if idempotent else None
        others = [n for n in names if n != name]
        fallback: tuple[str, ...] = ()
        if others and rng.random() < 0.6:
            fallback = tuple(rng.sample(others, rng.randint(1, len(others))))
        out.append(
            ChannelPlan(
                name=name,
                idempotent=idempotent,
                lookup=lookup,
                on_unknown=rng.choices(("assume_sent", "hold", "retry"), (5, 4, 1))[0],
                dedup_window=window,
                fallback=fallback,
                rate=rng.choice((None, None, None, 0.1, 0.25, 0.5, 2.0)),
                callbacks=rng.random() < 0.5,
                callback_key=rng.random() < 0.5,
                bounce=rng.choice((0.0, 0.0, 0.2, 0.5)),
                timeout=rng.choice((None, 10.0, 25.0)) if i or rng.random() < 0.7 else None,
                lookup_lag=rng.choice((0.0, 2.0, 5.0)) if lookup else 0.0,
                meaning_503=rng.choices(("ambiguous", "retry", "permanent"), (5, 3, 1))[0],
                meaning_400=rng.choices(("permanent", "ambiguous"), (4, 1))[0],
            )
        )
    return out


def _devices(
    seed: int, channels: list[ChannelPlan], people: tuple[str, ...]
) -> tuple[list[ChannelPlan], list[AddressPlan]]:
    """The services' own guards (collapse on the device) and the recipients' devices,
    drawn from a generator of their own (the rest of a seed's world stays as it was)."""
    rng = random.Random(f"world:{seed}:devices")
    out, addresses = [], []
    for plan in channels:
        collapse = rng.random() < 0.35
        devices = rng.random() < 0.35
        window = rng.choice((None, 20.0, 60.0)) if collapse else None
        if collapse:  # a push service: it keeps no key and posts no callbacks
            plan = replace(plan, idempotent=False, dedup_window=None, callbacks=False)
        out.append(replace(plan, collapse=collapse, collapse_window=window, devices=devices))
        if not devices:
            continue
        for person in people:
            for i in range(rng.choice((0, 1, 2, 2, 3))):
                token = hashlib.sha256(f"{seed}:{person}:{plan.name}:{i}".encode()).hexdigest()
                addresses.append(
                    AddressPlan(
                        recipient=person, channel=plan.name, address=token, dead=rng.random() < 0.3
                    )
                )
    return out, addresses


def _operator_lookup(seed: int, channels: list[ChannelPlan]) -> list[ChannelPlan]:
    """Which channels the operator can reconcile although the workers never ask their
    provider (its ``lookup`` turned on since), drawn from a generator of their own (the
    rest of a seed's world stays as it was). Not the inbox: it has no provider."""
    rng = random.Random(f"world:{seed}:operator-lookup")
    return [
        replace(plan, operator_lookup=not plan.lookup and not plan.inbox and rng.random() < 0.4)
        for plan in channels
    ]


def _inbox(
    seed: int, channels: list[ChannelPlan], workers: list[WorkerPlan]
) -> tuple[list[ChannelPlan], list[WorkerPlan]]:
    """Which channels are the in-app inbox, and how long the workers keep archived
    feed messages, drawn from a generator of their own (the rest of a seed's world
    stays as it was). An inbox channel has no provider to ask, remember keys or post
    callbacks, and no devices: its message is a row of kirim's own."""
    rng = random.Random(f"world:{seed}:inbox")
    out = []
    for plan in channels:
        # only a plain channel becomes the inbox: the seeds that draw callbacks, dedup
        # windows, lookups, collapse or devices keep them
        plain = not (plan.callbacks or plan.dedup_window or plan.lookup or plan.collapse)
        if rng.random() < 0.9 and plain and not plan.devices:
            plan = replace(
                plan,
                inbox=True,
                idempotent=True,
                lookup=False,
                dedup_window=None,
                callbacks=False,
                collapse=False,
                collapse_window=None,
                devices=False,
                bounce=0.0,
            )
        out.append(plan)
    archived = rng.choice((None, None, 5.0, 30.0))
    kept = [replace(w, settings=replace(w.settings, retention_archived=archived)) for w in workers]
    return out, kept


def _readers(
    seed: int, inbox: bool, people: Sequence[str], last_send: float
) -> tuple[list[FeedAct], list[StreamPlan]]:
    """The recipients' actions on their inbox and the live streams that follow it,
    drawn from a generator of their own (the rest of a seed's world stays as it was);
    none without an inbox channel."""
    if not inbox:
        return [], []
    rng = random.Random(f"world:{seed}:readers")
    span = last_send + 20.0
    acts = [
        FeedAct(
            at=rng.uniform(0.0, span),
            recipient=rng.choice(people),
            verb=rng.choice(FEED_VERBS),
            pick=rng.random(),
        )
        for _ in range(rng.choice((0, 2, 4, 8)))
    ]
    streams = []
    for person in people:
        if rng.random() < 0.5:
            continue
        cuts = sorted(rng.uniform(0.0, span) for _ in range(2 * rng.choice((1, 2, 3))))
        sessions = tuple((cuts[i], cuts[i + 1]) for i in range(0, len(cuts), 2))
        streams.append(StreamPlan(recipient=person, sessions=sessions))
    return acts, streams


def _clock(value: datetime) -> str:
    return value.strftime("%H:%M")


def _start(rng: random.Random, zone_name: str) -> tuple[float, str, datetime]:
    """The epoch of virtual time 0: a few seconds before a boundary of the first
    recipient's day (a DST transition of their zone, or a minute of a local clock),
    and that boundary's local time."""
    zone = ZoneInfo(zone_name)
    lead = rng.uniform(0.0, 40.0)
    if rng.random() < 0.3 and (jumps := _transitions(zone)):
        at = rng.choice(jumps)
        local = datetime.fromtimestamp(at, UTC).astimezone(zone)
        return at - lead, f"dst {zone_name} {local.isoformat()}", local
    day = datetime(2027, 1, 1, tzinfo=UTC) + timedelta(days=rng.randrange(0, 365))
    minute = rng.randrange(0, 24 * 60)
    local = day.astimezone(zone).replace(hour=minute // 60, minute=minute % 60, second=0)
    at = local.timestamp()
    return at - lead, f"clock {zone_name} {_clock(local)}", local


def _transitions(zone: ZoneInfo) -> list[float]:
    """The instants of 2027 at which ``zone``'s UTC offset changes."""
    out = []
    t = datetime(2027, 1, 1, tzinfo=UTC)
    step = timedelta(hours=6)
    offset = t.astimezone(zone).utcoffset()
    while t.year == 2027:
        nxt = t + step
        if nxt.astimezone(zone).utcoffset() != offset:
            low, high = t, nxt  # bisect to the second
            while (high - low) > timedelta(seconds=1):
                mid = low + (high - low) / 2
                if mid.astimezone(zone).utcoffset() == offset:
                    low = mid
                else:
                    high = mid
            out.append(high.replace(microsecond=0).timestamp())
            offset = nxt.astimezone(zone).utcoffset()
        t = nxt
    return out


def _near(rng: random.Random, local: datetime) -> str:
    """A clock time that matters at the run's start: the boundary's minute, the one
    after, half an hour after, or any."""
    pick = rng.random()
    if pick < 0.45:
        t = local
    elif pick < 0.6:
        t = local + timedelta(minutes=1)
    elif pick < 0.75:
        t = local + timedelta(minutes=30)
    else:
        t = local.replace(hour=rng.randrange(24), minute=rng.choice((0, 15, 30, 45)))
    return _clock(t)


def _window(rng: random.Random, local: datetime) -> str:
    """A daily span with one end near the start; the other some hours away."""
    near = _near(rng, local)
    hours, minutes = map(int, near.split(":"))
    far = (hours * 60 + minutes + rng.choice((60, 8 * 60, 13 * 60, 22 * 60))) % (24 * 60)
    other = f"{far // 60:02d}:{far % 60:02d}"
    return f"{near}-{other}" if rng.random() < 0.5 else f"{other}-{near}"


def _types(rng: random.Random, channels: list[str], local: datetime) -> list[TypePlan]:
    out = []
    for name in TYPE_NAMES[: rng.choice((0, 1, 1, 2, 2, 3))]:
        on = rng.sample(channels, rng.randint(1, len(channels)))
        table: dict[str, Any] = {"templates": {ch: {"title": f"{name} {{{{ n }}}}"} for ch in on}}
        if rng.random() < 0.2:
            table["critical"] = True
        if rng.random() < 0.25:
            table["defaults"] = {rng.choice(on): False}
        if rng.random() < 0.35:
            table["window"] = _window(rng, local)
        rule = rng.random()
        if rule < 0.3:
            table["throttle"] = {
                "limit": rng.choice((1, 2)),
                "window": f"{rng.choice((10, 20, 40))}s",
                "per": (per := rng.choice(("recipient", "type", "key"))),
                "over": rng.choice(("suppress", "defer")),
                **({"key": "topic"} if per == "key" else {}),
            }
        elif rule < 0.6:
            key = rng.choice(("recipient", "topic"))
            table["digest"] = {"window": f"{rng.choice((5, 10, 20))}s", "key": key}
            table["templates"] = {ch: {"title": f"{{{{ count }}}} {name}"} for ch in on}
        out.append(TypePlan(name=name, table=table))
    return out


def _preferences(
    rng: random.Random,
    people: tuple[str, ...],
    zones: dict[str, str],
    local: datetime,
    types: list[str],
    channels: list[str],
) -> list[PrefsChange]:
    """The preferences set before the run (at -1) and the changes while it runs."""

    def document(person: str) -> Preferences | None:
        if rng.random() < 0.25:
            return None
        choice: dict[str, bool] = {}
        if types and rng.random() < 0.4:
            kind = rng.choice((*types, "*"))
            where = rng.choice((*channels, "*")) if kind != "*" else rng.choice(channels)
            choice[f"{kind}:{where}"] = rng.random() < 0.4
        zone = zones[person] if rng.random() < 0.85 else rng.choice(ZONES)
        quiet = (
            Window.parse(_window(rng, local.astimezone(ZoneInfo(zone))))
            if (rng.random() < 0.5)
            else None
        )
        return Preferences(
            recipient_id=person,
            opt_out=rng.random() < 0.12,
            channels=choice,
            timezone=zone if rng.random() < 0.9 else None,
            quiet_hours=quiet,
        )

    out = [PrefsChange(at=-1.0, recipient=p, prefs=document(p)) for p in people]
    for _ in range(rng.choice((0, 1, 1, 2, 3))):
        person = rng.choice(people)
        out.append(PrefsChange(at=rng.uniform(0.0, 40.0), recipient=person, prefs=document(person)))
    return out


def _sends(
    rng: random.Random, types: list[TypePlan], people: tuple[str, ...], channels: list[str]
) -> list[Send]:
    out: list[Send] = []
    for i in range(1, rng.randint(2, 5) + 1):
        at = rng.uniform(0.0, 25.0)
        if out and rng.random() < 0.35:  # close after another: digests of several
            at = rng.choice(out).at + rng.uniform(0.0, 6.0)
        data = {"n": i, "topic": rng.choice(("a", "b"))}
        if types and rng.random() < 0.7:
            kind = rng.choice(types)
            chosen = tuple(sorted(rng.sample(people, rng.randint(1, len(people)))))
            out.append(
                Send(
                    at=at,
                    event_id=f"ev{i}",
                    type=kind.name,
                    recipients=chosen,
                    channel="",
                    data=data,
                )
            )
        else:
            out.append(
                Send(
                    at=at,
                    event_id=f"ev{i}",
                    type=None,
                    recipients=(rng.choice(people),),
                    channel=rng.choice(channels),
                    data=data,
                )
            )
    if out and rng.random() < 0.4:  # the application sends one again (a retried job)
        again = rng.choice(out)
        out.append(
            Send(
                at=again.at + rng.uniform(0.5, 12.0),
                event_id=again.event_id,
                type=again.type,
                recipients=again.recipients,
                channel=again.channel,
                data=again.data,
            )
        )
    return sorted(out, key=lambda s: (s.at, s.event_id))


def _settings(rng: random.Random, *, lease: float | None = None) -> WorkerSettings:
    lease = lease if lease is not None else rng.choice((6.0, 10.0, 10.0, 15.0))
    keep = rng.choice((None, None, 20.0, 60.0))
    return WorkerSettings(
        lease=lease,
        concurrency=(c := rng.choice((1, 2, 2, 4))),
        batch_size=rng.choice((1, c)),
        poll_interval=rng.choice((0.5, 1.0, 2.0)),
        heartbeat_interval=rng.choice((None, None, lease / 4, lease / 2)),
        reap_interval=rng.choice((None, None, 1.0, 3.0)),
        backoff_base=rng.choice((0.5, 1.0, 2.0)),
        backoff_max=rng.choice((4.0, 8.0, 16.0)),
        shutdown_grace=rng.choice((0.5, 1.5, 5.0)),
        request_timeout=rng.choice((8.0, 25.0)),
        send_margin=rng.choice((None, None, lease / 10, lease / 3)),
        settle_margin=rng.choice((None, None, 0.5, 5.0)),
        stats_interval=rng.choice((5.0, 10.0)),
        retention_keep=keep,
        retention_keys=rng.choice((0.0, 3600.0, 365 * 86400.0)),
    )


def _actions(rng: random.Random, made: int) -> list[Action]:
    out = []
    for _ in range(rng.choice((0, 0, 1, 1, 2, 3))):
        kinds: tuple[ActionKind, ...] = (
            "retry",
            "retry",
            "cancel",
            "reconcile",
            "reconcile",
            "prune",
        )
        kind = rng.choice(kinds)
        out.append(
            Action(at=rng.uniform(5.0, 60.0), kind=kind, target=rng.randint(1, max(1, made)))
        )
    return sorted(out, key=lambda a: a.at)
