"""The pure parts of the throttle, digests and request rates: windows, digest keys,
a channel's ``rate`` in kirim.toml."""

from __future__ import annotations

import pytest

from kirim.channels import Channel
from kirim.config import parse_config
from kirim.errors import ConfigError
from kirim.store.digests import digest_key
from kirim.store.rates import take_slot
from kirim.store.throttle import window_start
from kirim.testing import FlakyProvider


def test_windows_are_aligned_on_the_epoch() -> None:
    """A window holds its start and not its end."""
    assert window_start(1_800_000_000.0, 600) == 1_800_000_000.0
    assert window_start(1_800_000_599.9, 600) == 1_800_000_000.0
    assert window_start(1_800_000_600.0, 600) == 1_800_000_600.0


def test_digest_keys_differ_by_stream_and_window() -> None:
    """Each stream and window has its own key; a colon in a stream cannot make two
    streams share one."""
    keys = {
        digest_key("a|u1|email|x", 0.0),
        digest_key("a|u1|email|x", 600.0),
        digest_key("a|u1|email|y", 0.0),
        digest_key("a:window:600.000000", 0.0),
        digest_key("a", 600.0),
    }
    assert len(keys) == 5


@pytest.mark.parametrize("rate", [2_000_000, True, float("nan"), "10"])
def test_a_channel_built_in_python_follows_kirim_tomls_rate_rule(rate: object) -> None:
    """A rate kirim.toml refuses (over a million a second, a boolean) is refused by
    Channel too, with the same words."""
    with pytest.raises(ConfigError, match=r"channels\.push\.rate must be a number"):
        parse_config({"channels": {"push": {"url": "http://x", "rate": rate}}}, source="k")
    with pytest.raises(ValueError, match=r"channel 'push': rate must be a number"):
        Channel(name="push", provider=FlakyProvider(), rate=rate)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fallback", "problem"),
    [(["push"], "names the channel itself"), (["sms", "sms"], "names 'sms' twice")],
)
def test_a_channels_fallbacks_are_checked_alike_in_toml_and_python(
    fallback: list[str], problem: str
) -> None:
    """A fallback list naming the channel itself or a channel twice is refused with the
    same words from kirim.toml and from Channel."""
    table = {"push": {"url": "http://x", "fallback": fallback}, "sms": {"url": "http://y"}}
    with pytest.raises(ConfigError, match=rf"channels\.push\.fallback {problem}"):
        parse_config({"channels": table}, source="k")
    with pytest.raises(ValueError, match=rf"channel 'push': fallback {problem}"):
        Channel(name="push", provider=FlakyProvider(), fallback=tuple(fallback))


def test_a_channel_rate_is_read_from_kirim_toml() -> None:
    """``rate`` (requests per second) becomes the channel's ``rate``; absent: None."""
    config = parse_config(
        {"channels": {"push": {"url": "http://x", "rate": 20}, "sms": {"url": "http://y"}}},
        source="kirim.toml",
    )
    assert config.channels["push"].build().rate == 20.0
    assert config.channels["sms"].build().rate is None


@pytest.mark.parametrize("rate", [0, -1, float("inf"), float("nan"), "10"])
def test_a_channel_rate_must_be_a_positive_number(rate: object) -> None:
    """A rate that is not a positive finite number is a ConfigError naming it."""
    with pytest.raises(ConfigError, match=r"channels\.push\.rate must be"):
        parse_config({"channels": {"push": {"url": "http://x", "rate": rate}}}, source="k")


def test_a_channel_built_in_python_checks_its_rate() -> None:
    """Channel(rate=0) is refused, as the store's slot is."""
    with pytest.raises(ValueError, match="rate must be a number of requests per second"):
        Channel(name="push", provider=FlakyProvider(), rate=0)
    with pytest.raises(ValueError, match="rate must be a positive number"):
        next(take_slot("push", 0.0, 0.0))
