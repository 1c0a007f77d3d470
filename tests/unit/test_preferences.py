"""Recipient preferences: their JSON form, its checks, and ``decide`` across DST changes."""

from __future__ import annotations

from datetime import datetime, time
from zoneinfo import ZoneInfo

import pytest

from kirim.preferences import (
    SEND,
    Preferences,
    Reason,
    TypePolicy,
    Window,
    decide,
    wall_instant,
)
from kirim.validation import BadValue

NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")
SHIPPED = TypePolicy(name="order_shipped")


def at(text: str, zone: ZoneInfo) -> float:
    """Epoch seconds of a local wall-clock time (the first one, if it happens twice)."""
    return datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


def local(epoch: float, zone: ZoneInfo) -> str:
    return datetime.fromtimestamp(epoch, zone).isoformat()


def quiet(zone: str, span: str = "22:00-07:00", **more: object) -> Preferences:
    return Preferences.from_json("u1", {"timezone": zone, "quiet_hours": span, **more})


# -- the JSON form ---------------------------------------------------------------------


def test_the_document_round_trips() -> None:
    """to_json, then from_json, gives the same preferences (quiet hours as an object)."""
    prefs = Preferences.from_json(
        "u1",
        {
            "opt_out": False,
            "channels": {"order_shipped:email": False, "*:sms": True},
            "timezone": "Asia/Jakarta",
            "quiet_hours": {"start": "22:00", "end": "07:00"},
        },
    )
    assert prefs.quiet_hours == Window(time(22), time(7))
    doc = prefs.to_json()
    assert doc["quiet_hours"] == {"start": "22:00", "end": "07:00"}
    assert list(doc["channels"]) == ["*:sms", "order_shipped:email"]  # sorted
    assert Preferences.from_json("u1", doc) == prefs


def test_every_field_may_be_left_out() -> None:
    """An empty document is the defaults."""
    assert Preferences.from_json("u1", {}) == Preferences(recipient_id="u1")


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"opt-out": True}, "opt-out"),
        ({"opt_out": "yes"}, "opt_out"),
        ({"channels": {"order_shipped:email": "off"}}, "channels['order_shipped:email']"),
        ({"channels": {"email": False}}, "channels['email']"),
        ({"channels": {"*:*": False}}, "channels['*:*']"),
        ({"channels": {":email": False}}, "channels[':email']"),
        ({"channels": []}, "channels"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"timezone": ""}, "timezone"),
        ({"timezone": "Europe/" + "x" * 60}, "timezone"),
        ({"quiet_hours": {"start": "25:00", "end": "07:00"}}, "quiet_hours.start"),
        ({"quiet_hours": {"start": "22:00"}}, "quiet_hours"),
        ({"quiet_hours": "07:00-07:00"}, "quiet_hours"),
        ({"quiet_hours": "22-07"}, "quiet_hours"),
        ({"quiet_hours": "22:00-07:00-08:00"}, "quiet_hours"),
        ([], "preferences"),
    ],
)
def test_a_bad_document_names_its_field(value: object, field: str) -> None:
    """BadValue (a ValueError) whose name is the field."""
    with pytest.raises(BadValue) as raised:
        Preferences.from_json("u1", value)
    assert raised.value.name == field
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize("rid", ["", "   ", "a\x00b", "x" * 256])
def test_a_bad_recipient_id_is_refused(rid: str) -> None:
    with pytest.raises(BadValue, match="recipient_id"):
        Preferences.from_json(rid, {})


# -- opt-outs and defaults -------------------------------------------------------------


def test_no_preferences_send() -> None:
    assert decide(SHIPPED, "email", None, 0.0).action == "send"


def test_a_global_opt_out_suppresses() -> None:
    verdict = decide(SHIPPED, "email", Preferences(recipient_id="u1", opt_out=True), 0.0)
    assert (verdict.action, verdict.reason) == ("suppress", Reason.OPTED_OUT)


def test_the_most_specific_channel_choice_wins() -> None:
    """type:channel beats type:*, which beats *:channel."""
    prefs = Preferences(
        recipient_id="u1",
        channels={"*:email": False, "order_shipped:*": True, "order_shipped:sms": False},
    )
    assert decide(SHIPPED, "email", prefs, 0.0).action == "send"  # order_shipped:*
    sms = decide(SHIPPED, "sms", prefs, 0.0)
    assert (sms.action, sms.reason) == ("suppress", Reason.CHANNEL_OPTED_OUT)
    other = decide(TypePolicy(name="promo"), "email", prefs, 0.0)
    assert other.reason is Reason.CHANNEL_OPTED_OUT  # *:email


def test_a_type_off_by_default_needs_an_opt_in() -> None:
    promo = TypePolicy(name="promo", defaults={"email": False})
    assert decide(promo, "email", None, 0.0).reason is Reason.NOT_OPTED_IN
    assert decide(promo, "push", None, 0.0).action == "send"
    opted_in = Preferences(recipient_id="u1", channels={"promo:email": True})
    assert decide(promo, "email", opted_in, 0.0).action == "send"


def test_a_critical_type_ignores_opt_outs_and_quiet_hours() -> None:
    alert = TypePolicy(name="password_reset", critical=True, defaults={"email": False})
    prefs = quiet("America/New_York", opt_out=True, channels={"password_reset:email": False})
    assert decide(alert, "email", prefs, at("2026-01-10T23:30", NEW_YORK)).action == "send"


# -- quiet hours and send windows, DST-correct ------------------------------------------


def test_quiet_hours_defer_to_their_end_in_the_recipients_zone() -> None:
    prefs = quiet("Asia/Jakarta")
    jakarta = ZoneInfo("Asia/Jakarta")
    verdict = decide(SHIPPED, "email", prefs, at("2026-05-04T23:15", jakarta))
    assert verdict.action == "defer"
    assert verdict.until is not None
    assert local(verdict.until, jakarta) == "2026-05-05T07:00:00+07:00"
    assert decide(SHIPPED, "email", prefs, at("2026-05-05T07:00", jakarta)).action == "send"
    assert decide(SHIPPED, "email", prefs, at("2026-05-05T21:59", jakarta)).action == "send"


@pytest.mark.parametrize(
    ("zone", "night", "opening", "hours"),
    [
        # spring forward: 02:00 -> 03:00, the night is an hour shorter
        (NEW_YORK, "2026-03-07T22:00", "2026-03-08T07:00:00-04:00", 8),
        (BERLIN, "2026-03-28T22:00", "2026-03-29T07:00:00+02:00", 8),
        # fall back: 02:00 -> 01:00 (New York), 03:00 -> 02:00 (Berlin): an hour longer
        (NEW_YORK, "2026-10-31T22:00", "2026-11-01T07:00:00-05:00", 10),
        (BERLIN, "2026-10-24T22:00", "2026-10-25T07:00:00+01:00", 10),
    ],
)
def test_quiet_hours_on_the_night_the_clocks_change(
    zone: ZoneInfo, night: str, opening: str, hours: int
) -> None:
    """Deferred to 07:00 local on the morning after the change, from every hour of the
    night, and that opening sends; the night lasts 8 or 10 real hours."""
    prefs = quiet(str(zone))
    start = at(night, zone)
    until = None
    for step in range(0, hours * 3600, 1800):  # every half hour of real time
        verdict = decide(SHIPPED, "email", prefs, start + step)
        assert verdict.action == "defer", local(start + step, zone)
        assert verdict.until is not None
        assert until is None or verdict.until == until
        until = verdict.until
    assert until is not None
    assert local(until, zone) == opening
    assert until - start == hours * 3600
    assert decide(SHIPPED, "email", prefs, until).action == "send"
    assert decide(SHIPPED, "email", prefs, start - 1).action == "send"


def test_an_end_that_does_not_exist_opens_at_the_jump() -> None:
    """Quiet until 02:30 on the night New York skips 02:00-03:00: open at 03:00 EDT."""
    prefs = quiet("America/New_York", "22:00-02:30")
    verdict = decide(SHIPPED, "email", prefs, at("2026-03-08T01:45", NEW_YORK))
    assert verdict.until is not None
    assert local(verdict.until, NEW_YORK) == "2026-03-08T03:00:00-04:00"
    assert decide(SHIPPED, "email", prefs, verdict.until).action == "send"


def test_an_end_that_happens_twice_opens_at_the_first() -> None:
    """Quiet until 01:30 on the night New York repeats 01:00-02:00: open at the first
    01:30 (EDT), and the repeated half hour after it is not quiet again."""
    prefs = quiet("America/New_York", "22:00-01:30")
    verdict = decide(SHIPPED, "email", prefs, at("2026-11-01T00:45", NEW_YORK))
    assert verdict.until is not None
    assert local(verdict.until, NEW_YORK) == "2026-11-01T01:30:00-04:00"
    repeated = verdict.until + 1800  # 01:00 EST, the second time the clock reads 01:00
    assert local(repeated, NEW_YORK) == "2026-11-01T01:00:00-05:00"
    assert decide(SHIPPED, "email", prefs, repeated).action == "send"


def test_wall_instant_of_a_missing_time_is_the_jump() -> None:
    jump = wall_instant(datetime(2026, 3, 29).date(), time(2, 30), BERLIN)
    assert local(jump, BERLIN) == "2026-03-29T03:00:00+02:00"


def test_a_types_window_defers_to_its_next_opening() -> None:
    """A type sent 09:00-17:00 local: at 18:00 it waits for 09:00 the next day, across
    Berlin's spring change."""
    daytime = TypePolicy(name="digest", window=Window(time(9), time(17)))
    prefs = Preferences(recipient_id="u1", timezone="Europe/Berlin")
    verdict = decide(daytime, "email", prefs, at("2026-03-28T18:00", BERLIN))
    assert verdict.until is not None
    assert local(verdict.until, BERLIN) == "2026-03-29T09:00:00+02:00"
    assert decide(daytime, "email", prefs, at("2026-03-29T12:00", BERLIN)).action == "send"


def test_quiet_hours_and_a_types_window_together() -> None:
    """The first instant outside the quiet hours and inside the window."""
    late = TypePolicy(name="t", window=Window(time(6), time(12)))
    prefs = quiet("Europe/Berlin")
    verdict = decide(late, "email", prefs, at("2026-06-01T03:00", BERLIN))
    assert verdict.until is not None
    assert local(verdict.until, BERLIN) == "2026-06-01T07:00:00+02:00"


def test_a_window_inside_the_quiet_hours_wins() -> None:
    """Quiet hours covering the whole of a type's window: the window's opening."""
    night = TypePolicy(name="t", window=Window(time(23), time(5)))
    prefs = quiet("Europe/Berlin")
    verdict = decide(night, "email", prefs, at("2026-06-01T12:00", BERLIN))
    assert verdict.until is not None
    assert local(verdict.until, BERLIN) == "2026-06-01T23:00:00+02:00"


def test_a_critical_type_keeps_its_own_window() -> None:
    alert = TypePolicy(name="t", critical=True, window=Window(time(8), time(20)))
    verdict = decide(alert, "email", None, at("2026-06-01T21:00", ZoneInfo("UTC")))
    assert verdict.action == "defer"


def test_without_a_zone_quiet_hours_are_utc() -> None:
    prefs = Preferences(recipient_id="u1", quiet_hours=Window(time(22), time(7)))
    verdict = decide(SHIPPED, "email", prefs, at("2026-06-01T23:00", ZoneInfo("UTC")))
    assert verdict.until == at("2026-06-02T07:00", ZoneInfo("UTC"))


def test_a_window_inside_the_quiet_hours_opens_when_it_is_due() -> None:
    """Quiet hours covering a type's window: a delivery due at the window's opening
    (or later inside it) goes then, instead of waiting for the next day's for ever."""
    day = TypePolicy(name="t", window=Window(time(8), time(21)))
    prefs = quiet("Europe/Berlin", "07:00-22:00")
    for now in ("2026-06-01T08:00", "2026-06-01T12:30"):
        assert decide(day, "email", prefs, at(now, BERLIN)) == SEND
    early = decide(day, "email", prefs, at("2026-06-01T07:30", BERLIN))
    assert early.until is not None
    assert local(early.until, BERLIN) == "2026-06-01T08:00:00+02:00"
