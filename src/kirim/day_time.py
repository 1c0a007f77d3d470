"""A time of a recipient's day: the next instant a zone's clock reads ``HH:MM``
(the workflow step ``delay = { until = "09:00" }``; docs/workflows.md).

DST-correct, by the rule of quiet hours (``kirim.preferences.wall_instant``): a time
that does not exist that day (02:30 when the clocks jump from 02:00 to 03:00) falls
at the jump, the first instant after it; one that happens twice (01:30 when they fall
back) at its first occurrence only (an instant inside the repeated hour waits for the
next day's, not for the second 01:30).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from kirim.preferences import check_timezone, wall_instant
from kirim.validation import BadValue, shown

_CLOCK = re.compile(r"([01]\d|2[0-3]):([0-5]\d)")
#: the zone of a recipient who named none, when the step names none either
DEFAULT_ZONE = "UTC"


@dataclass(frozen=True, slots=True)
class DayTime:
    """A wall-clock time of day, ``HH:MM`` (24-hour), in no zone of its own."""

    clock: time

    @staticmethod
    def parse(value: Any, name: str = "until") -> DayTime:
        """``"09:00"`` as a DayTime; BadValue naming ``name`` for anything else."""
        match = _CLOCK.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise BadValue(name, f"must be a 24-hour time HH:MM, like 09:00, not {shown(value)}")
        return DayTime(time(int(match[1]), int(match[2])))

    def __str__(self) -> str:
        return f"{self.clock:%H:%M}"


@functools.lru_cache(maxsize=256)
def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name`` (checked: ``kirim.preferences.check_timezone``)."""
    return ZoneInfo(check_timezone(name))


def next_instant(now: float, at: DayTime, zone_name: str) -> float:
    """The first instant from ``now`` (``now`` itself included) at which
    ``zone_name``'s clock reads ``at``, by the DST rule above."""
    tz = zone(zone_name)
    today = datetime.fromtimestamp(now, UTC).astimezone(tz).date()
    for offset in range(3):
        instant = wall_instant(today + timedelta(days=offset), at.clock, tz)
        if instant >= now:
            return instant
    raise AssertionError("a time of day comes within two local days")  # pragma: no cover


def local_text(instant: float, zone_name: str) -> str:
    """``instant`` as ``zone_name``'s clock reads it: ``2026-12-03 09:00 CET``."""
    wall = datetime.fromtimestamp(instant, UTC).astimezone(zone(zone_name))
    return f"{wall:%Y-%m-%d %H:%M} {wall.tzname()}"


def zone_of(recipient_zone: str | None, step_zone: str | None) -> str:
    """The zone an until-delay reads: the recipient's, else the step's, else UTC."""
    return recipient_zone or step_zone or DEFAULT_ZONE


def until_why(at: DayTime, zone_name: str) -> str:
    """The why an until-delay's step records: ``until 09:00 in Europe/Berlin``."""
    return f"until {at} in {zone_name}"


def zone_in(why: str | None) -> str | None:
    """The zone an until-delay's recorded ``why`` names (``until_why``), or None."""
    if not why or not why.startswith("until ") or " in " not in why:
        return None
    return why.rpartition(" in ")[2] or None


__all__ = [
    "DEFAULT_ZONE",
    "DayTime",
    "local_text",
    "next_instant",
    "until_why",
    "zone",
    "zone_in",
    "zone_of",
]
