"""kirim.validation: the one set of rules for numbers, text and payloads at every door."""

from __future__ import annotations

import dataclasses
import math

import pytest

from kirim.errors import ConfigError
from kirim.validation import (
    MAX_KEY_LENGTH,
    BadValue,
    Number,
    check_key,
    check_payload,
    check_text,
    require_number,
    shown,
)
from kirim.worker.settings import RULES, WorkerSettings


@pytest.mark.parametrize(
    "bad", [math.nan, math.inf, -math.inf, 1e308, 0, -1, True, "3", None, 10**400]
)
def test_a_number_outside_its_rule_is_refused_in_one_line(bad) -> None:
    """nan, the infinities, huge and out-of-range values, bools and strings are refused
    with one line naming the setting, the rule and the value."""
    with pytest.raises(BadValue) as caught:
        require_number("lease", bad, minimum=0, above=True, maximum=86_400)
    message = str(caught.value)
    assert message.startswith("lease must be a number greater than 0 and at most 86400, not ")
    assert "\n" not in message
    assert len(message) < 120
    assert isinstance(caught.value, ConfigError)
    assert isinstance(caught.value, ValueError)


def test_integers_refuse_fractions_and_accept_ints() -> None:
    """An integer rule refuses 2.5 and 2.0 and returns an int as it is."""
    rule = Number(minimum=1, maximum=10, integer=True)
    assert rule.check("concurrency", 3) == 3
    for bad in (2.5, 2.0):
        with pytest.raises(BadValue, match="must be an integer from 1 to 10, not 2"):
            rule.check("concurrency", bad)
    assert Number(minimum=0, maximum=1, optional=True).check("x", None) is None


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("lease", math.nan),
        ("lease", math.inf),
        ("lease", 1e308),
        ("lease", 0),
        ("concurrency", 2.5),
        ("concurrency", 0),
        ("batch_size", 0),
        ("batch_size", -5),
        ("poll_interval", 0),
        ("backoff_base", -1),
        ("backoff_max", -1),
        ("backoff_max", math.inf),
        ("shutdown_grace", -1),
        ("request_timeout", 0),
        ("request_timeout", math.nan),
        ("send_margin", -1),
        ("heartbeat_interval", 0),
        ("reap_interval", -1),
        ("stats_interval", 0),
    ],
)
def test_every_worker_setting_has_a_type_and_a_range(name, bad) -> None:
    """Each numeric WorkerSettings field refuses a value outside its rule, naming itself."""
    assert set(RULES) == {f.name for f in dataclasses.fields(WorkerSettings)}
    with pytest.raises(BadValue, match=f"^{name} must be"):
        WorkerSettings(**{name: bad})


def test_intervals_within_the_lease() -> None:
    """heartbeat_interval and send_margin must be shorter than the lease."""
    with pytest.raises(BadValue, match="heartbeat_interval must be less than the lease"):
        WorkerSettings(lease=5, heartbeat_interval=5)
    with pytest.raises(BadValue, match="send_margin must be less than the lease"):
        WorkerSettings(lease=5, send_margin=6)
    assert WorkerSettings(lease=5, heartbeat_interval=1, send_margin=1).send_within == 4


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a\x00b", "must not contain NUL characters"),
        ("a\ud800b", "no lone surrogates"),
        ("", "is required"),
        ("   ", "is required"),
        (7, "is required"),
    ],
)
def test_text_every_backend_can_store(value, message) -> None:
    """check_text refuses NUL, lone surrogates, blanks and non-strings."""
    with pytest.raises(BadValue, match=message):
        check_text("recipient", value)
    assert check_text("recipient", "user 1007 ✓") == "user 1007 ✓"


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("k" * (MAX_KEY_LENGTH + 1), "at most 255 characters, not 256"),
        ("k" * 100_000, "at most 255 characters, not 100000"),
        ("clé", "printable ASCII"),
        ("a\tb", "printable ASCII"),
        ("a\nb", "printable ASCII"),
        (" padded", "printable ASCII"),
        ("k\x00", "NUL"),
    ],
)
def test_explicit_keys_are_short_printable_ascii(key, message) -> None:
    """An explicit key is printable ASCII (it travels in HTTP headers), at most 255 long."""
    with pytest.raises(BadValue, match=message) as caught:
        check_key(key)
    assert len(str(caught.value)) < 200
    assert check_key("k" * MAX_KEY_LENGTH) == "k" * MAX_KEY_LENGTH
    assert check_key("order-48291 push:1/2") == "order-48291 push:1/2"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"t": "\ud800"}, r"^payload\['t'\] must be valid Unicode"),
        ({"a": [1, {"b": "x\x00"}]}, r"^payload\['a'\]\[1\]\['b'\] must not contain NUL"),
        ({"\ud800": 1}, "^a key in payload must be valid Unicode"),
        ({"a": {"k\x00": 1}}, r"^a key in payload\['a'\] must not contain NUL"),
        ("\x00", "^payload must not contain NUL"),
    ],
)
def test_payload_text_is_checked_everywhere(payload, message) -> None:
    """NUL and lone surrogates are found in keys and values at any depth, with the path."""
    with pytest.raises(BadValue, match=message):
        check_payload(payload)


def test_deep_and_valid_payloads_pass() -> None:
    """A payload nested far deeper than Python's recursion limit is walked iteratively;
    valid text (emoji: a surrogate pair in JSON) passes."""
    deep: list[object] = ["ok"]
    for _ in range(50_000):
        deep = [deep]
    check_payload(deep)
    check_payload({"title": "shipped 📦", "n": [1, 2.5, None, True]})


def test_shown_values_are_short_and_escaped() -> None:
    """A bad value is quoted escaped (NUL, surrogates) and cut to a short length."""
    assert shown("\x00\ud800") == "'\\x00\\ud800'"
    assert len(shown("x" * 10_000)) == 40
