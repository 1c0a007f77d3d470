"""The next time of a recipient's day (``kirim.day_time``): ordinary days, the day
the clocks jump forward (a time that does not exist fires at the jump) and the day
they fall back (a repeated time fires at its first occurrence only), in real zones."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kirim.day_time import DayTime, local_text, next_instant, until_why, zone_in, zone_of
from kirim.validation import BadValue


def utc(*parts: int) -> float:
    return datetime(*parts, tzinfo=UTC).timestamp()  # type: ignore[misc]


def nine(text: str = "09:00") -> DayTime:
    return DayTime.parse(text)


def test_later_today_when_the_time_has_not_come() -> None:
    """08:00 CET: 09:00 is in an hour."""
    assert next_instant(utc(2026, 12, 2, 7, 0), nine(), "Europe/Berlin") == utc(2026, 12, 2, 8)


def test_tomorrow_when_it_has_passed() -> None:
    """13:00 CET: 09:00 is tomorrow's."""
    assert next_instant(utc(2026, 12, 2, 12), nine(), "Europe/Berlin") == utc(2026, 12, 3, 8)


def test_now_itself_when_the_clock_reads_it() -> None:
    """At 09:00 exactly, the wait is over."""
    assert next_instant(utc(2026, 12, 2, 8), nine(), "Europe/Berlin") == utc(2026, 12, 2, 8)


def test_the_same_instant_reads_differently_in_each_zone() -> None:
    """09:00 in New York is 14:00 UTC in winter, 13:00 in summer."""
    assert next_instant(utc(2026, 12, 2, 12), nine(), "America/New_York") == utc(2026, 12, 2, 14)
    assert next_instant(utc(2026, 7, 2, 12), nine(), "America/New_York") == utc(2026, 7, 2, 13)


def test_a_time_the_clocks_skip_fires_at_the_jump_berlin() -> None:
    """Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC); 02:30 fires then."""
    got = next_instant(utc(2026, 3, 28, 12), nine("02:30"), "Europe/Berlin")
    assert got == utc(2026, 3, 29, 1, 0)
    # and the next day it is an ordinary 02:30 CEST
    assert next_instant(got + 1, nine("02:30"), "Europe/Berlin") == utc(2026, 3, 30, 0, 30)


def test_a_time_the_clocks_skip_fires_at_the_jump_new_york() -> None:
    """New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00 UTC); 02:15 fires then."""
    got = next_instant(utc(2026, 3, 7, 20), nine("02:15"), "America/New_York")
    assert got == utc(2026, 3, 8, 7, 0)


def test_the_wait_over_the_spring_night_is_an_hour_shorter() -> None:
    """From 09:00 CET the day before, the next 09:00 (CEST) is 23 hours later."""
    start = utc(2026, 3, 28, 8)
    assert next_instant(start + 1, nine(), "Europe/Berlin") - start == 23 * 3600


def test_a_repeated_time_fires_at_its_first_occurrence_new_york() -> None:
    """New York, 2026-11-01: 01:30 happens at 05:30 UTC (EDT) and 06:30 (EST): the first."""
    got = next_instant(utc(2026, 10, 31, 12), nine("01:30"), "America/New_York")
    assert got == utc(2026, 11, 1, 5, 30)


def test_inside_the_repeated_hour_the_second_occurrence_is_not_taken() -> None:
    """At 01:45 EDT (after the first 01:30), 01:30 EST an hour later is not it: tomorrow's."""
    got = next_instant(utc(2026, 11, 1, 5, 45), nine("01:30"), "America/New_York")
    assert got == utc(2026, 11, 2, 6, 30)


def test_a_repeated_time_fires_at_its_first_occurrence_berlin() -> None:
    """Berlin, 2026-10-25: 02:30 is at 00:30 UTC (CEST) and 01:30 (CET): the first."""
    got = next_instant(utc(2026, 10, 24, 12), nine("02:30"), "Europe/Berlin")
    assert got == utc(2026, 10, 25, 0, 30)


@pytest.mark.parametrize("text", ["25:00", "9am", "9:00", "09:60", "", "09:00:00", 900, None])
def test_only_a_24_hour_hh_mm_is_a_time_of_day(text: object) -> None:
    """Anything else is refused, naming the value."""
    with pytest.raises(BadValue, match="must be a 24-hour time HH:MM"):
        DayTime.parse(text)


def test_the_recipients_zone_wins_then_the_steps_then_utc() -> None:
    """zone_of: the recipient's, else the step's, else UTC."""
    assert zone_of("Asia/Jakarta", "Europe/Berlin") == "Asia/Jakarta"
    assert zone_of(None, "Europe/Berlin") == "Europe/Berlin"
    assert zone_of(None, None) == "UTC"


def test_the_recorded_why_names_its_zone_and_reads_back() -> None:
    """until_why writes the zone; zone_in reads it; local_text shows the local clock."""
    why = until_why(nine(), "America/New_York")
    assert why == "until 09:00 in America/New_York"
    assert zone_in(why) == "America/New_York"
    assert zone_in("1h") is None
    assert local_text(utc(2026, 12, 2, 14), "America/New_York") == "2026-12-02 09:00 EST"
