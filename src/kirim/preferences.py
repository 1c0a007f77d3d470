"""Recipient preferences and the rule that reads them (no I/O).

A recipient's ``Preferences`` (global opt-out, on/off per type x channel, a time zone,
quiet hours) are stored as the JSON document of ``to_json`` (``kirim_preferences``);
a notification type's ``TypePolicy`` (critical or not, defaults per channel, its own
send window) comes from kirim.toml. ``decide`` reads both and says what happens to
one delivery: sent now, ``suppressed`` with a ``Reason``, or deferred to the opening
of the recipient's send window. It is called at enqueue (the fan-out planner) and
again at claim time (``store.rules``), so a preference changed in between wins.

Local time, DST-correct: a ``Window`` is a span of wall-clock time, and the span of
one night runs from the first instant the recipient's clock reads ``start`` to the
first instant it reads ``end`` (over midnight when ``end < start``). On the night the
clocks change, quiet hours 22:00-07:00 last 8 or 10 hours of real time; a wall-clock
time that does not exist (02:30 when clocks jump from 02:00 to 03:00) opens at the
jump; one that happens twice (01:30 when clocks fall back) opens at its first.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from kirim import limits
from kirim.validation import BadValue, check_text, shown

#: what ``Preferences.to_json`` writes and ``from_json`` accepts
FIELDS = ("opt_out", "channels", "timezone", "quiet_hours")
_CLOCK = re.compile(r"([01]\d|2[0-3]):([0-5]\d)")
#: the longest time zone name kept (the tz database's longest is 32 characters)
MAX_ZONE_NAME = 64
_SEARCH = 8  # moves between quiet hours and a type's window before giving up on both


class Reason(enum.StrEnum):
    """Why a delivery is ``suppressed`` (its ``reason`` column)."""

    OPTED_OUT = "opted_out"  # the recipient opted out of everything
    CHANNEL_OPTED_OUT = "channel_opted_out"  # ... of this type on this channel
    NOT_OPTED_IN = "not_opted_in"  # the type is off by default on this channel
    THROTTLED = "throttled"  # over the type's throttle
    NO_ADDRESS = "no_address"  # no address on a channel that needs one (kirim.addresses)


@dataclass(frozen=True, slots=True)
class Window:
    """A daily span of local time, ``start`` to ``end`` (over midnight when end < start)."""

    start: time
    end: time

    def __post_init__(self) -> None:
        if self.start == self.end:
            raise BadValue("window", f"must not start and end at the same time ({self})")
        if self.start.tzinfo is not None or self.end.tzinfo is not None:
            raise BadValue("window", "is local time: its times carry no time zone")

    @staticmethod
    def parse(text: Any, name: str = "window") -> Window:
        """``"22:00-07:00"`` (24-hour ``HH:MM``) as a Window; BadValue naming ``name``."""
        spans = text.split("-") if isinstance(text, str) else []
        clocks = [_CLOCK.fullmatch(part.strip()) for part in spans]
        if len(clocks) != 2 or not all(clocks):
            raise BadValue(name, f"must be HH:MM-HH:MM, like 22:00-07:00, not {shown(text)}")
        start, end = (time(int(c[1]), int(c[2])) for c in clocks if c)
        return _window(name, start, end)

    def to_json(self) -> dict[str, str]:
        return {"start": self.start.strftime("%H:%M"), "end": self.end.strftime("%H:%M")}

    @staticmethod
    def from_json(value: Any, name: str = "window") -> Window:
        """``{"start": "22:00", "end": "07:00"}`` or ``"22:00-07:00"``."""
        if isinstance(value, str):
            return Window.parse(value, name)
        if not isinstance(value, dict) or set(value) != {"start", "end"}:
            raise BadValue(name, 'must be {"start": "HH:MM", "end": "HH:MM"}')
        return _window(
            name, _clock(f"{name}.start", value["start"]), _clock(f"{name}.end", value["end"])
        )

    def __str__(self) -> str:
        return f"{self.start:%H:%M}-{self.end:%H:%M}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Preferences:
    """One recipient's choices. ``channels`` maps ``"type:channel"``, ``"type:*"`` or
    ``"*:channel"`` to on/off (the most specific wins); ``quiet_hours`` is in
    ``timezone`` (an IANA name; None: UTC)."""

    recipient_id: str
    opt_out: bool = False
    channels: dict[str, bool] = field(default_factory=dict)
    timezone: str | None = None
    quiet_hours: Window | None = None
    updated_at: float | None = None

    def choice(self, type_name: str, channel: str) -> bool | None:
        """What the recipient said about ``type_name`` on ``channel``: the most specific
        of ``type:channel``, ``type:*``, ``*:channel``; None when nothing."""
        for pattern in (f"{type_name}:{channel}", f"{type_name}:*", f"*:{channel}"):
            if pattern in self.channels:
                return self.channels[pattern]
        return None

    def to_json(self) -> dict[str, Any]:
        """The stored document (no id, no time: those are columns)."""
        return {
            "opt_out": self.opt_out,
            "channels": dict(sorted(self.channels.items())),
            "timezone": self.timezone,
            "quiet_hours": None if self.quiet_hours is None else self.quiet_hours.to_json(),
        }

    @staticmethod
    def from_json(recipient_id: str, value: Any, *, updated_at: float | None = None) -> Preferences:
        """Raises ``ValueError`` with the field named when ``value`` is not valid.

        Every field may be left out (its default); an unknown one is refused, so a
        typo (``opt-out``) is not silently ignored."""
        recipient_id = check_recipient_id(recipient_id)
        if not isinstance(value, dict):
            raise BadValue("preferences", "must be a JSON object")
        if unknown := sorted(set(value) - set(FIELDS), key=str):
            raise BadValue(
                str(unknown[0]), f"is not a preference (the fields: {', '.join(FIELDS)})"
            )
        opt_out = value.get("opt_out", False)
        if not isinstance(opt_out, bool):
            raise BadValue("opt_out", f"must be true or false, not {shown(opt_out)}")
        timezone = value.get("timezone")
        quiet = value.get("quiet_hours")
        return Preferences(
            recipient_id=recipient_id,
            opt_out=opt_out,
            channels=check_channels(value.get("channels", {})),
            timezone=None if timezone is None else check_timezone(timezone),
            quiet_hours=None if quiet is None else Window.from_json(quiet, "quiet_hours"),
            updated_at=updated_at,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TypePolicy:
    """What a notification type says about preferences: ``critical`` types ignore
    opt-outs and quiet hours; ``defaults`` (channel -> on/off) apply when the recipient
    said nothing (absent: on); ``window``: the type's own send window (local time of
    the recipient)."""

    name: str
    critical: bool = False
    defaults: dict[str, bool] = field(default_factory=dict)
    window: Window | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """``send`` now; ``suppress`` with ``reason``; ``defer`` until ``until`` (epoch s)."""

    action: Literal["send", "suppress", "defer"]
    reason: Reason | None = None
    until: float | None = None


SEND = Verdict(action="send")


def decide(policy: TypePolicy, channel: str, prefs: Preferences | None, now: float) -> Verdict:
    """Whether a delivery of ``policy``'s type on ``channel`` goes now, is suppressed,
    or waits for the recipient's send window (quiet hours and the type's window, in
    the recipient's time zone, DST-correct).

    The recipient's word beats the type's default (``*:email = on`` opts in to a type
    that is off by default); a critical type ignores both opt-outs and quiet hours but
    keeps its own window. When quiet hours cover the whole of a type's window, the
    type's window wins (its next opening)."""
    if not policy.critical:
        if prefs is not None and prefs.opt_out:
            return Verdict(action="suppress", reason=Reason.OPTED_OUT)
        said = None if prefs is None else prefs.choice(policy.name, channel)
        if said is False:
            return Verdict(action="suppress", reason=Reason.CHANNEL_OPTED_OUT)
        if said is None and not policy.defaults.get(channel, True):
            return Verdict(action="suppress", reason=Reason.NOT_OPTED_IN)
    quiet = None if policy.critical or prefs is None else prefs.quiet_hours
    if quiet is None and policy.window is None:
        return SEND
    zone = _zone(prefs.timezone if prefs is not None and prefs.timezone else "UTC")
    until = opening(now, zone, quiet=quiet, window=policy.window)
    return SEND if until <= now else Verdict(action="defer", until=until)


def opening(now: float, zone: ZoneInfo, *, quiet: Window | None, window: Window | None) -> float:
    """The first instant from ``now`` outside ``quiet`` and inside ``window`` (each
    optional), in ``zone``'s local time; ``now`` itself when it is one.

    When the quiet hours cover the whole of the window, the window wins: the first
    instant from ``now`` inside it (``now`` itself when the window is open), so that a
    delivery deferred to the window's opening goes then, not a day later each time."""
    at = now
    for _ in range(_SEARCH):
        moved = at
        if quiet is not None and (end := _span_end(quiet, at, zone)) is not None:
            at = end
        if window is not None and _span_end(window, at, zone) is None:
            at = _next_start(window, at, zone)
        if at == moved:
            return at
    assert window is not None  # quiet hours alone end in one move
    return now if _span_end(window, now, zone) is not None else _next_start(window, now, zone)


# -- checks ----------------------------------------------------------------------------


def check_recipient_id(value: Any) -> str:
    """A recipient id: non-blank text, at most ``kirim.limits.RECIPIENT_ID`` bytes (it is
    a primary key and a path segment of the HTTP API)."""
    return check_text("recipient_id", value, limit=limits.RECIPIENT_ID)


def check_channels(value: Any) -> dict[str, bool]:
    """``{"type:channel" | "type:*" | "*:channel": bool}``; BadValue naming the entry."""
    if not isinstance(value, dict):
        raise BadValue("channels", 'must be an object like {"order_shipped:email": false}')
    checked: dict[str, bool] = {}
    for pattern, on in value.items():
        check_pattern(pattern)
        if not isinstance(on, bool):
            raise BadValue(f"channels[{shown(pattern)}]", f"must be true or false, not {shown(on)}")
        checked[pattern] = on
    return checked


def check_pattern(pattern: Any) -> str:
    """``type:channel``, ``type:*`` or ``*:channel`` (``*:*`` is ``opt_out``)."""
    name = f"channels[{shown(pattern)}]"
    if not isinstance(pattern, str) or pattern.count(":") != 1:
        raise BadValue(name, "must be TYPE:CHANNEL, TYPE:* or *:CHANNEL")
    check_text(name, pattern, limit=limits.PATTERN)
    type_name, channel = pattern.split(":")
    if not type_name.strip() or not channel.strip() or pattern != pattern.strip():
        raise BadValue(name, "must be TYPE:CHANNEL, TYPE:* or *:CHANNEL")
    if type_name == channel == "*":
        raise BadValue(name, "would be every type on every channel: use opt_out")
    return pattern


def check_known(
    patterns: Iterable[str], *, types: Collection[str], channels: Collection[str]
) -> None:
    """BadValue for the first pattern whose type or channel is not configured (``*``
    matches any): a typo would otherwise be stored and never match anything."""
    for pattern in patterns:
        type_name, _, channel = pattern.partition(":")
        name = f"channels[{shown(pattern)}]"
        if type_name != "*" and type_name not in types:
            known = ", ".join(sorted(types)) or "none configured"
            raise BadValue(name, f"names the type {type_name!r}, which is not configured "
                           f"(known: {known})")  # fmt: skip
        if channel != "*" and channel not in channels:
            known = ", ".join(sorted(channels)) or "none configured"
            raise BadValue(name, f"names the channel {channel!r}, which is not configured "
                           f"(known: {known})")  # fmt: skip


def check_timezone(value: Any) -> str:
    """An IANA time zone name (``Asia/Jakarta``) that this host's tz database knows."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_ZONE_NAME:
        raise BadValue(
            "timezone", f"must be an IANA time zone name like Asia/Jakarta, not {shown(value)}"
        )
    try:
        _zone(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise BadValue("timezone", f"is not a known IANA time zone: {shown(value)}") from None
    return value


def _clock(name: str, value: Any) -> time:
    if not isinstance(value, str) or not (match := _CLOCK.fullmatch(value)):
        raise BadValue(name, f"must be a 24-hour time HH:MM, like 07:00, not {shown(value)}")
    return time(int(match[1]), int(match[2]))


def _window(name: str, start: time, end: time) -> Window:
    if start == end:
        raise BadValue(name, f"must not start and end at the same time ({start:%H:%M})")
    return Window(start, end)


@functools.lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


# -- local time ------------------------------------------------------------------------


def wall_instant(day: date, clock: time, zone: ZoneInfo) -> float:
    """The first instant (epoch s) at which ``zone``'s clock reads ``day clock`` or
    later: the first of a repeated time, the jump for a time that does not exist."""
    naive = datetime.combine(day, clock)
    first = naive.replace(tzinfo=zone, fold=0)
    if _wall(first.timestamp(), zone) == naive:
        return first.timestamp()
    # In a gap: fold=1 reads it with the offset after the jump (an earlier instant),
    # fold=0 with the one before (a later one); the jump lies between.
    low = int(naive.replace(tzinfo=zone, fold=1).timestamp())
    high = int(first.timestamp()) + 1
    while low < high:  # the first second whose wall time is not before ``naive``
        mid = (low + high) // 2
        if _wall(mid, zone) < naive:
            low = mid + 1
        else:
            high = mid
    return float(low)


def _wall(at: float, zone: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(at, UTC).astimezone(zone).replace(tzinfo=None, fold=0)


def _span(window: Window, day: date, zone: ZoneInfo) -> tuple[float, float]:
    """The window's span that begins on local ``day`` (empty, start == end, where the
    whole window falls in a gap of the clock: a DST change's skipped hour)."""
    last = day + timedelta(days=1) if window.end < window.start else day
    return wall_instant(day, window.start, zone), wall_instant(last, window.end, zone)


def _spans(window: Window, at: float, zone: ZoneInfo) -> list[tuple[float, float]]:
    """The window's spans that begin on the local day before ``at``'s, on it and after."""
    today = _wall(at, zone).date()
    return [_span(window, today + timedelta(days=offset), zone) for offset in (-1, 0, 1)]


def _span_end(window: Window, at: float, zone: ZoneInfo) -> float | None:
    """The end of the span of ``window`` that holds ``at``, or None when ``at`` is outside."""
    for start, end in _spans(window, at, zone):
        if start <= at < end:
            return end
    return None


def _next_start(window: Window, at: float, zone: ZoneInfo) -> float:
    """The first start of a span of ``window`` after ``at``, not an empty one (a window
    inside a DST gap does not open that day: deferred to its start, a delivery found
    it closed there and was deferred again)."""
    today = _wall(at, zone).date()
    for offset in range(3):
        start, end = _span(window, today + timedelta(days=offset), zone)
        if start > at and end > start:
            return start
    raise AssertionError("a daily window starts within three local days")  # pragma: no cover
