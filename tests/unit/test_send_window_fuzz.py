"""Fuzz of the send-window rule (the family of 'lost': a delivery deferred for ever):
whatever the quiet hours, the type's window, the zone and the time, a deferred
delivery is due within two days, and at the instant it was deferred to it goes."""

from __future__ import annotations

from datetime import UTC, datetime, time

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kirim.preferences import Preferences, TypePolicy, Window, decide

ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Jakarta")
#: 2026, the days around each zone's changes included
START = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
YEAR = 365 * 86_400.0


@st.composite
def windows(draw: st.DrawFn) -> Window:
    start = draw(st.integers(0, 24 * 60 - 1))
    end = draw(st.integers(0, 24 * 60 - 1).filter(lambda m: m != start))
    return Window(time(start // 60, start % 60), time(end // 60, end % 60))


@settings(max_examples=400, deadline=None)
@given(
    window=st.none() | windows(),
    quiet=st.none() | windows(),
    zone=st.sampled_from(ZONES),
    offset=st.floats(0, YEAR) | st.integers(0, int(YEAR) // 60).map(lambda m: m * 60.0),
    critical=st.booleans(),
)
# A window wholly inside New York's skipped hour on 2026-03-08, quiet hours covering
# the rest of the day (found by this fuzz): deferred to the jump, it found the window
# closed there (its span that day is empty) and was deferred again.
@example(
    window=Window(time(2, 0), time(2, 1)),
    quiet=Window(time(0, 1), time(0, 0)),
    zone="America/New_York",
    offset=5_641_260.0,
    critical=False,
)
def test_a_deferred_delivery_goes_at_the_instant_it_was_deferred_to(
    window: Window | None, quiet: Window | None, zone: str, offset: float, critical: bool
) -> None:
    """defer(until=T) then decide at T: send; and T is less than two days away."""
    policy = TypePolicy(name="t", critical=critical, window=window)
    prefs = Preferences(recipient_id="u", timezone=zone, quiet_hours=quiet)
    now = START + offset
    verdict = decide(policy, "email", prefs, now)
    if verdict.action == "send":
        return
    assert verdict.action == "defer"
    assert verdict.until is not None
    assert now < verdict.until <= now + 2 * 86_400
    again = decide(policy, "email", prefs, verdict.until)
    assert again.action == "send", (verdict, again)
