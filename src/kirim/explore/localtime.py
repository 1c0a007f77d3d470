"""The explorer's own reading of send windows: written apart from
``kirim.preferences``, by brute force over whole minutes, so that it can disagree.

docs/notifications.md says: a daily span of local time runs from the first instant
the recipient's clock reads its start to the first instant it reads its end (over
midnight when the end is earlier); quiet hours defer a delivery to their end; a
type's window defers it to its next opening; when quiet hours leave no instant of a
window's span free, the window wins (it goes at the span's opening); a critical type
ignores quiet hours, never its window. Every boundary is a whole minute of UTC (wall
clocks read whole minutes, zones' offsets and transitions are whole minutes), so
stepping a minute at a time finds each exactly.
"""

from __future__ import annotations

import functools
import math
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from kirim.preferences import Window

MINUTE = 60.0
#: how far ahead an opening is looked for (then: never)
HORIZON_DAYS = 3


@functools.lru_cache(maxsize=64)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _wall(at: float, zone: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(at, UTC).astimezone(zone).replace(tzinfo=None, fold=0)


@functools.lru_cache(maxsize=4096)
def _first_reading(day: date, clock: time, zone_name: str) -> float:
    """The first instant (a whole UTC minute) at which the zone's clock reads
    ``day clock`` or later, found by stepping from a day before."""
    zone = _zone(zone_name)
    target = datetime.combine(day, clock)
    t = math.floor(datetime.combine(day, clock, tzinfo=UTC).timestamp() / MINUTE) * MINUTE
    t -= 30 * 3600.0  # every zone's offset is within +-14 h
    while _wall(t, zone) < target:
        t += MINUTE
    return t


def spans(window: Window, at: float, zone_name: str) -> list[tuple[float, float]]:
    """The window's spans of the local days around ``at`` (yesterday to in three days)."""
    today = _wall(at, _zone(zone_name)).date()
    out = []
    for offset in range(-1, HORIZON_DAYS + 1):
        day = today + timedelta(days=offset)
        last = day + timedelta(days=1) if window.end < window.start else day
        out.append(
            (
                _first_reading(day, window.start, zone_name),
                _first_reading(last, window.end, zone_name),
            )
        )
    return out


def inside(window: Window, at: float, zone_name: str) -> tuple[float, float] | None:
    """The span of ``window`` that holds ``at``, or None."""
    for start, end in spans(window, at, zone_name):
        if start <= at < end:
            return start, end
    return None


@functools.lru_cache(maxsize=1024)
def _covered(quiet: Window, span: tuple[float, float], zone_name: str) -> bool:
    """Whether quiet hours leave no minute of ``span`` free."""
    t = span[0]
    while t < span[1]:
        if inside(quiet, t, zone_name) is None:
            return False
        t += MINUTE
    return True


def allowed(at: float, zone_name: str, *, quiet: Window | None, window: Window | None) -> bool:
    """Whether a delivery may go at ``at``: inside the type's window (if any) and
    outside quiet hours (if any), unless quiet hours cover the whole span of the
    window that holds ``at`` (the window wins)."""
    span = None
    if window is not None:
        span = inside(window, at, zone_name)
        if span is None:
            return False
    if quiet is None or inside(quiet, at, zone_name) is None:
        return True
    return span is not None and _covered(quiet, span, zone_name)


def opening(at: float, zone_name: str, *, quiet: Window | None, window: Window | None) -> float:
    """The first instant from ``at`` at which a delivery may go (``at`` itself when it
    may); ``math.inf`` when none within the horizon."""
    if allowed(at, zone_name, quiet=quiet, window=window):
        return at
    t = math.floor(at / MINUTE) * MINUTE + MINUTE
    end = at + (HORIZON_DAYS - 1) * 86400.0
    while t < end:
        if allowed(t, zone_name, quiet=quiet, window=window):
            return t
        t += MINUTE
    return math.inf
