"""Fuzz of the limits family on both backends: text of every width (1 to 4 bytes a
character, control characters among them) at and around each field's limit in bytes,
sent through the API. Every answer is 201 for a value within its limit, 422 naming the
field for one past it, never a 5xx (PostgreSQL answered 503 for what its indexes
cannot hold). Bounded: the same 150 examples each run."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from http_kit import api_on
from kirim import limits
from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.notify import parse_type
from kirim.testing import FlakyProvider, ManualClock
from kirim.text import first_control

EXAMPLES = 150
TYPES = {
    "digested": {
        "templates": {"email": {"body": "{{ count }}"}},
        "digest": {"window": "10m", "key": "group"},
    },
    "throttled": {
        "templates": {"email": {"body": "hi"}},
        "throttle": {"limit": 1000, "window": "1h", "per": "key", "key": "group"},
    },
}
#: one character of each width, and the controls that forge lines and terminals
ALPHABET = ["a", "é", "漢", "😀", "|", "%", "\r", "\x1b", "\x85", "\u2028"]
#: where a value goes: (route, body field named in the 422, its limit)
PLACES = {
    "event_id": ("/v1/notifications", "body.event_id", limits.EVENT_ID),
    "recipient": ("/v1/notifications", "body.recipient", limits.RECIPIENT),
    "event": ("/v1/events", "body.event_id", limits.EVENT_ID),
    "recipient_id": ("/v1/events", "body.recipients", limits.RECIPIENT_ID),
    "address": ("/v1/events", "body.recipients", limits.RECIPIENT),
    "digest_group": ("/v1/events", "body.data", limits.GROUP),
    "throttle_group": ("/v1/events", "body.data", limits.GROUP),
}


@dataclass(frozen=True)
class Case:
    place: str
    value: str


@st.composite
def cases(draw: st.DrawFn) -> Case:
    place = draw(st.sampled_from(sorted(PLACES)))
    limit = PLACES[place][2].bytes
    target = limit + draw(st.integers(-4, 4))
    chars = draw(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=6))
    clean = draw(st.booleans())
    if clean:
        chars = [c for c in chars if first_control(c) is None] or ["a"]
    value = ""
    for c in itertools.cycle(chars):
        if limits.utf8_size(value + c) > target:
            break
        value += c
    return Case(place, value or "a")


def body_of(case: Case, n: int) -> dict[str, Any]:
    v = case.value
    note = {"event_id": f"e-{n}", "recipient": f"r-{n}", "channel": "email", "payload": {}}
    event = {"type": "throttled", "recipients": [f"u-{n}"], "data": {"group": "g"}}
    return {
        "event_id": {**note, "event_id": v},
        "recipient": {**note, "recipient": v},
        "event": {**event, "event_id": v},
        "recipient_id": {**event, "event_id": f"e-{n}", "recipients": [v]},
        "address": {
            **event,
            "event_id": f"e-{n}",
            "recipients": [{"id": f"u-{n}", "to": {"email": v}}],
        },
        "digest_group": {**event, "type": "digested", "event_id": f"e-{n}", "data": {"group": v}},
        "throttle_group": {**event, "event_id": f"e-{n}", "data": {"group": v}},
    }[case.place]


@pytest.fixture
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as found:
        yield found


def test_no_value_around_a_limit_makes_the_server_fail(
    database_url: str, runner: asyncio.Runner
) -> None:
    """Within its limit (and free of control characters) a value is recorded (201);
    past it, or with a control character, a 422 names its field; never a 5xx."""
    kirim = Kirim(
        Config(database=database_url),
        channels={"email": Channel(name="email", provider=FlakyProvider())},
        clock=ManualClock(),
        types=[parse_type(name, spec) for name, spec in TYPES.items()],
    )
    runner.run(kirim.open(migrate=True))
    context = api_on(kirim)
    api = runner.run(context.__aenter__())
    numbers = itertools.count(1)
    sent: set[Case] = set()  # a value sent again would be a replay (or another body)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases())
    def run(case: Case) -> None:
        if case in sent:
            return
        sent.add(case)
        path, field, limit = PLACES[case.place]
        answer = runner.run(api.client.post(path, json=body_of(case, next(numbers))))
        fits = limits.utf8_size(case.value) <= limit.bytes and first_control(case.value) is None
        assert answer.status_code == (201 if fits else 422), (case, answer.text)
        if not fits:
            named = [d["field"] for d in answer.json()["error"]["details"]]
            assert any(f.startswith(field) for f in named), answer.text

    try:
        run()
    finally:
        runner.run(context.__aexit__(None, None, None))
        runner.run(kirim.close())
