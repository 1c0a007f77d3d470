"""A type's ``steps``, ``cancel_on`` and ``cancel_key`` (``kirim.notify.steps``): what
is accepted, and each mistake a ``ConfigError`` naming the step; and the branch rule
(``kirim.runs.decide``) on settled, unsettled and doubtful steps."""

from __future__ import annotations

from typing import Any

import pytest

from kirim.errors import ConfigError
from kirim.model import DeliveryStatus, Doubt
from kirim.notify.steps import Branch, Delay, Send, step_from_json
from kirim.notify.types import parse_type
from kirim.runs import StepState, decide

TEMPLATES = {"inbox": {"title": "t", "body": "b"}, "email": {"subject": "s", "body": "b"}}


def _type(steps: Any, **more: Any):  # type: ignore[no-untyped-def]
    return parse_type("flow", {"templates": TEMPLATES, "steps": steps, **more})


def test_the_escalation_parses_into_its_steps() -> None:
    """send, delay (a duration), branch on an earlier send (else: a later step)."""
    t = _type(
        [
            {"send": "inbox"},
            {"delay": "1h"},
            {"branch": "unread", "step": "inbox", "else": "bye"},
            {"send": "email"},
            {"send": "email", "name": "bye"},
        ],
        cancel_on=["order_done"],
        cancel_key="order_id",
    )
    assert t.steps[0] == Send(channel="inbox", name="inbox")
    assert t.steps[1] == Delay(seconds=3600.0, name="delay1")
    assert t.steps[2] == Branch(condition="unread", name="branch2", step="inbox", otherwise="bye")
    assert (t.cancel_on, t.cancel_key) == (("order_done",), "order_id")


@pytest.mark.parametrize(
    ("steps", "more", "message"),
    [
        ([], {}, "non-empty list"),
        ([{"send": "sms"}], {}, "'sms' is not a channel of the type"),
        ([{"send": "inbox", "delay": "1h"}], {}, "exactly one of send, delay, branch"),
        ([{"delay": "soon"}, {"send": "inbox"}], {}, "must be a duration"),
        ([{"delay": "1h"}], {}, "no send step"),
        ([{"send": "inbox"}, {"send": "inbox"}], {}, "is step 0's too"),
        ([{"branch": "unread", "step": "inbox"}, {"send": "inbox"}], {}, "not an earlier send"),
        ([{"send": "inbox"}, {"branch": "opened", "step": "inbox"}], {}, "not a condition"),
        ([{"send": "inbox"}, {"branch": "read"}], {}, "needs step"),
        ([{"send": "inbox"}, {"branch": "data", "field": "x"}], {}, "needs field"),
        ([{"send": "inbox"}, {"branch": "read", "step": "inbox", "else": "inbox"}], {}, "later"),
        ([{"send": "inbox"}, {"branch": "read", "step": "inbox", "on_doubt": "x"}], {}, "on_doubt"),
        ([{"send": "inbox", "wait": 1}], {}, "unknown key(s) wait"),
        ([{"send": "inbox"}, {"delay": {"until": "25:00"}}], {}, "24-hour time HH:MM"),
        ([{"send": "inbox"}, {"delay": {"until": "9am"}}], {}, "not '9am'"),
        ([{"send": "inbox"}, {"delay": {"until": 9}}], {}, "24-hour time HH:MM"),
        ([{"send": "inbox"}, {"delay": "1h", "until": "09:00"}], {}, "not both"),
        ([{"send": "inbox"}, {"delay": {"until": "09:00", "seconds": 5}}], {}, "not both"),
        ([{"send": "inbox"}, {"delay": {"zone": "UTC"}}], {}, "needs until"),
        ([{"send": "inbox"}, {"delay": {"until": "09:00", "tz": "UTC"}}], {}, "unknown key(s) tz"),
        ([{"send": "inbox"}, {"delay": {"until": "09:00", "zone": "Mars/Base"}}], {}, "zone is"),
        ([{"send": "inbox"}], {"cancel_on": ["done"]}, "cancel_on needs cancel_key"),
        ([{"send": "inbox"}], {"cancel_key": "id"}, "cancel_key without cancel_on"),
        ([{"send": "inbox"}], {"throttle": {"limit": 1, "window": "1h"}}, "throttle or a digest"),
    ],
)
def test_each_mistake_is_a_config_error_naming_it(steps: Any, more: Any, message: str) -> None:
    """A wrong step is refused when the type is read, saying which and why."""
    with pytest.raises(ConfigError, match=r"types\.flow") as raised:
        _type(steps, **more)
    assert message in str(raised.value)


def test_a_delay_until_a_time_of_the_recipients_day() -> None:
    """delay = { until = "09:00" } (zone: for recipients without one), kept in a run's
    JSON as it was."""
    t = _type(
        [
            {"send": "inbox"},
            {"delay": {"until": "09:00"}},
            {"delay": {"until": "18:30", "zone": "Europe/Berlin"}, "name": "evening"},
            {"send": "email"},
        ]
    )
    assert t.steps[1] == Delay(seconds=0.0, name="delay1", until="09:00")
    assert t.steps[2] == Delay(seconds=0.0, name="evening", until="18:30", zone="Europe/Berlin")
    for step in t.steps:
        assert step_from_json(step.to_json()) == step


def test_cancel_on_without_steps_is_refused() -> None:
    """cancel_on cancels runs: a type without steps has none."""
    with pytest.raises(ConfigError, match="give steps"):
        parse_type("t", {"templates": TEMPLATES, "cancel_on": ["x"], "cancel_key": "id"})


UNREAD = Branch(condition="unread", name="b", step="inbox")
FAILED = Branch(condition="failed", name="b", step="email")


def test_a_step_not_settled_is_waited_for() -> None:
    """Pending or processing: no decision yet."""
    for status in (DeliveryStatus.PENDING, DeliveryStatus.PROCESSING):
        assert decide(UNREAD, {}, StepState(status=status)).taken is None


def test_the_feed_marks_decide_an_inbox_branch() -> None:
    """Sent and read: unread is false; sent and not read: true."""
    read = StepState(status=DeliveryStatus.SENT, in_feed=True, read=True, seen=True)
    assert decide(UNREAD, {}, read).taken is False
    assert decide(UNREAD, {}, StepState(status=DeliveryStatus.SENT, in_feed=True)).taken is True


def test_a_step_in_doubt_takes_on_doubt_else_by_default() -> None:
    """A held or assumed step is neither failed nor sent for sure: else, unless the
    branch names then or wait; a condition on the doubt itself is true."""
    held = StepState(status=DeliveryStatus.IN_DOUBT, doubt=Doubt.HELD)
    assumed = StepState(status=DeliveryStatus.SENT, doubt=Doubt.ASSUMED_SENT)
    assert decide(FAILED, {}, held).taken is False
    assert decide(FAILED, {}, assumed).taken is False
    then = Branch(condition="failed", name="b", step="email", on_doubt="then")
    wait = Branch(condition="failed", name="b", step="email", on_doubt="wait")
    assert decide(then, {}, held).taken is True
    assert decide(wait, {}, held).taken is None
    doubt = Branch(condition="in_doubt", name="b", step="email")
    assert decide(doubt, {}, assumed).taken is True


def test_a_data_branch_reads_the_event() -> None:
    """branch = "data": the event's field equals the value."""
    vip = Branch(condition="data", name="b", field="vip", equals=True)
    assert decide(vip, {"vip": True}, None).taken is True
    assert decide(vip, {"vip": False}, None).taken is False
