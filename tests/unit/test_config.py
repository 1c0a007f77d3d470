"""kirim.toml parsing: the fixed contract, the environment, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from kirim.config import load_config, parse_config
from kirim.errors import ConfigError
from kirim.model import OnUnknown

CONTRACT = """\
database = "sqlite:///kirim.db"
[worker]
lease = 30          # seconds; renewed by heartbeat while work is in flight
max_attempts = 8
[channels.push]
provider = "webhook"
url = "http://127.0.0.1:8080/push"
timeout = 10
idempotent = true          # the endpoint honours Idempotency-Key
on_unknown = "assume_sent" # or "hold", "retry"
"""


def test_the_documented_contract_parses(tmp_path: Path, monkeypatch) -> None:
    """The config of the README parses into the settings it names."""
    monkeypatch.delenv("KIRIM_DATABASE_URL", raising=False)
    path = tmp_path / "kirim.toml"
    path.write_text(CONTRACT)
    config = load_config(path)
    assert config.database == "sqlite:///kirim.db"
    assert config.worker.lease == 30
    assert config.max_attempts == 8
    push = config.channels["push"]
    assert push.on_unknown is OnUnknown.ASSUME_SENT
    channel = push.build()
    assert channel.idempotent is True
    assert channel.provider.url == "http://127.0.0.1:8080/push"


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch) -> None:
    """KIRIM_DATABASE_URL wins over the file; an explicit database wins over both."""
    path = tmp_path / "kirim.toml"
    path.write_text(CONTRACT)
    monkeypatch.setenv("KIRIM_DATABASE_URL", "sqlite:///env.db")
    assert load_config(path).database == "sqlite:///env.db"
    assert load_config(path, database="sqlite:///flag.db").database == "sqlite:///flag.db"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"databse": "x"}, "unknown key"),
        ({"worker": {"leese": 3}}, r"unknown \[worker\] key"),
        ({"worker": {"lease": "30"}}, "worker.lease must be a number"),
        ({"worker": {"lease": 0}}, "lease must be a number of seconds greater than 0"),
        ({"worker": {"max_attempts": 0}}, "max_attempts must be an integer from 1 to 1000"),
        ({"channels": {"push": {"provider": "webhook"}}}, "url is required"),
        ({"channels": {"push": {"url": "http://x", "on_unknown": "maybe"}}}, "assume_sent"),
        ({"channels": {"push": {"url": "http://x", "colour": 1}}}, "unknown"),
        ({"channels": {"push": {"url": "http://x", "timeout": "abc"}}}, "timeout must be a number"),
        ({"channels": {"push": {"url": "http://x", "lookup": True}}}, "has no lookup"),
        ({"channels": {"push": {"url": "ftp://x"}}}, "http:// or https://"),
        ({"channels": {"push": {"url": "http://x", "idempotent": "yes"}}}, "true or false"),
        ({"channels": {"push": {"url": "http://x", "headers": {"a": 1}}}}, "table of strings"),
    ],
)
def test_bad_config_says_what_to_fix(data, message) -> None:
    """Each mistake in a config is named in the error."""
    with pytest.raises(ConfigError, match=message):
        parse_config(data, source="kirim.toml")


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    """A missing or malformed file is a ConfigError, not a traceback."""
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("database = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_a_webhook_with_a_lookup_url_may_use_lookup() -> None:
    """lookup = true is allowed for a webhook that names lookup_url (with {key});
    lookup_lag (default 0) becomes the provider's attribute."""
    spec = {
        "url": "http://127.0.0.1:8080/push",
        "lookup": True,
        "lookup_url": "http://127.0.0.1:8080/lookup/{key}",
        "lookup_lag": 2.5,
    }
    config = parse_config({"channels": {"push": spec}})
    channel = config.channels["push"].build()
    assert channel.lookup is True
    assert channel.provider.lookup_url == "http://127.0.0.1:8080/lookup/{key}"
    assert channel.provider.lookup_lag == 2.5
    plain = parse_config({"channels": {"push": {"url": "http://x"}}}).channels["push"].build()
    assert plain.lookup is False
    assert plain.provider.lookup_lag == 0.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"lookup": True}, "no lookup without lookup_url"),
        ({"lookup_url": "http://x/lookup"}, r"lookup_url must be .* with \{key\}"),
        ({"lookup_url": "ftp://x/{key}"}, r"lookup_url must be an http:// or https://"),
        ({"lookup_url": 7}, "lookup_url must be"),
        ({"lookup_lag": -1}, "lookup_lag must be a number of seconds from 0 to 86400"),
        ({"lookup_lag": float("inf")}, "lookup_lag must be a number of seconds from 0 to 86400"),
        ({"lookup_lag": "1"}, "lookup_lag must be a number"),
    ],
)
def test_bad_webhook_lookup_settings_say_what_to_fix(spec, message) -> None:
    """A lookup needs a lookup_url with {key}; lookup_lag is seconds >= 0."""
    data = {"channels": {"push": {"url": "http://x", **spec}}}
    with pytest.raises(ConfigError, match=message):
        parse_config(data, source="kirim.toml")


@pytest.mark.parametrize(
    ("worker", "message"),
    [
        ({"lease": float("nan")}, "worker.lease must be a number of seconds greater than 0"),
        ({"lease": float("inf")}, "worker.lease must be a number of seconds greater than 0"),
        ({"lease": 1e308}, "worker.lease must be .* at most 86400, not 1e[+]308"),
        ({"concurrency": 2.5}, "worker.concurrency must be an integer from 1 to 10000, not 2.5"),
        ({"batch_size": 0}, "worker.batch_size must be an integer from 1 to 10000, not 0"),
        ({"batch_size": -1}, "worker.batch_size must be an integer"),
        ({"poll_interval": 0}, "worker.poll_interval must be a number of seconds from 0.001"),
        ({"backoff_base": -1}, "worker.backoff_base must be a number of seconds from 0"),
        ({"backoff_max": -1}, "worker.backoff_max must be"),
        ({"shutdown_grace": -1}, "worker.shutdown_grace must be"),
        ({"request_timeout": 0}, "worker.request_timeout must be"),
        ({"send_margin": float("nan")}, "worker.send_margin must be"),
        ({"max_attempts": 2**70}, "worker.max_attempts must be an integer from 1 to 1000"),
    ],
)
def test_every_worker_number_has_a_type_and_a_range(worker, message) -> None:
    """Each numeric [worker] setting outside its type or range is a one-line ConfigError."""
    with pytest.raises(ConfigError, match=f"^kirim.toml: {message}") as caught:
        parse_config({"worker": worker}, source="kirim.toml")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("limit", [float("inf"), 10**30, 0, 1.5, "1"])
def test_max_payload_bytes_is_a_bounded_integer(limit) -> None:
    """max_payload_bytes = inf (or huge, zero, fractional) is a ConfigError, not an
    OverflowError."""
    with pytest.raises(ConfigError, match="max_payload_bytes must be an integer from 1"):
        parse_config({"max_payload_bytes": limit}, source="kirim.toml")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"timeout": float("inf")}, "channels.push.timeout must be a number of seconds"),
        ({"timeout": 0}, "channels.push.timeout must be"),
        ({"dedup_window": float("inf")}, "channels.push.dedup_window must be"),
        ({"lookup_lag": float("nan")}, "channels.push.lookup_lag must be"),
    ],
)
def test_channel_numbers_are_bounded(spec, message) -> None:
    """A channel's timeout, dedup_window and lookup_lag are finite and in range."""
    with pytest.raises(ConfigError, match=message):
        parse_config({"channels": {"push": {"url": "http://x", **spec}}}, source="kirim.toml")


def test_the_documented_stats_interval_is_accepted() -> None:
    """[worker] stats_interval (documented with the metrics) is a setting, default 10 s."""
    assert parse_config({}).worker.stats_interval == 10
    assert parse_config({"worker": {"stats_interval": 2.5}}).worker.stats_interval == 2.5
    with pytest.raises(ConfigError, match=r"worker\.stats_interval must be"):
        parse_config({"worker": {"stats_interval": 0}})


PROVIDERS = '''
from kirim.providers.base import Sent

class Minimal:
    """A provider as the README describes it: idempotent and send, nothing else."""
    idempotent = False
    async def send(self, message):
        return Sent(provider_message_id="m-" + message.idempotency_key)

def minimal(**options):
    return Minimal()

def not_a_provider(**options):
    return {"url": "http://x"}

def broken(**options):
    raise RuntimeError("no credentials")
'''


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An importable module of provider factories; its name."""
    (tmp_path / "my_providers.py").write_text(PROVIDERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_providers"


def test_a_factory_of_a_non_provider_is_a_config_error(factories: str) -> None:
    """A factory that returns something without send() or idempotent, or that raises,
    is a ConfigError when the channel is built, naming the channel."""
    for attr, message in [
        ("not_a_provider", "returned dict is not a provider"),
        ("broken", "failed: no credentials"),
    ]:
        config = parse_config({"channels": {"push": {"provider": f"{factories}:{attr}"}}})
        with pytest.raises(ConfigError, match=f"channels.push.provider .*{message}"):
            config.channels["push"].build()


def test_a_minimal_factory_provider_builds(factories: str) -> None:
    """A provider with only idempotent and send builds into a channel."""
    config = parse_config({"channels": {"push": {"provider": f"{factories}:minimal"}}})
    channel = config.channels["push"].build()
    assert channel.idempotent is False


def _fallbacks(**fallback: object) -> dict[str, object]:
    """Channels a, b and c (webhooks), with these ``fallback`` lists."""
    hook = {"url": "http://127.0.0.1:9/x"}
    return {
        "channels": {
            n: {**hook, **({"fallback": fallback[n]} if n in fallback else {})}
            for n in ("a", "b", "c")
        }
    }


def test_a_fallback_list_builds_into_the_channel_and_not_the_provider(factories: str) -> None:
    """fallback names other channels, in order; it is the channel's, not an option
    passed to a factory provider."""
    config = parse_config(_fallbacks(a=["c", "b"]))
    channel = config.channels["a"].build()
    assert channel.fallback == ("c", "b")
    assert channel.chain == ("a", "c", "b")
    assert config.channels["b"].build().fallback == ()
    data = {
        "channels": {
            "push": {"provider": f"{factories}:minimal", "fallback": ["b"]},
            "b": {"url": "http://127.0.0.1:9/x"},
        }
    }
    assert "fallback" not in parse_config(data).channels["push"].options
    assert parse_config(data).channels["push"].build().fallback == ("b",)


APNS = {"provider": "apns", "team_id": "T", "key_id": "K", "private_key": "x", "topic": "t"}


@pytest.mark.parametrize(
    ("fallback", "message"),
    [
        ({"provider": "smtp", "host": "h", "from": "a@b"}, "'mail' takes email addresses, 'ios'"),
        ({**APNS, "topic": "other"}, None),
    ],
)
def test_a_fallback_takes_the_same_kind_of_address(fallback, message) -> None:
    """A failover sends to the delivery's own address: a device token's channel cannot
    fall back on email (main sent the token there as the address); another APNs channel
    takes the same tokens."""
    data = {"channels": {"ios": {**APNS, "fallback": ["mail"]}, "mail": fallback}}
    if message is None:
        assert parse_config(data, source="kirim.toml").channels["ios"].fallback == ("mail",)
        return
    with pytest.raises(ConfigError, match=message):
        parse_config(data, source="kirim.toml")


def test_a_channel_that_takes_any_text_goes_with_any() -> None:
    """A webhook passes the address on as it is: an email channel may fall back on one
    (docs/channels.md's example), and a webhook on an APNs channel."""
    data = {
        "channels": {
            "email": {"provider": "smtp", "host": "h", "from": "a@b", "fallback": ["hook"]},
            "hook": {"url": "http://x", "fallback": ["ios"]},
            "ios": APNS,
        }
    }
    assert parse_config(data, source="kirim.toml").channels["email"].fallback == ("hook",)
