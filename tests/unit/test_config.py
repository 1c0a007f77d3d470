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
        ({"worker": {"lease": 0}}, "lease must be positive"),
        ({"worker": {"max_attempts": 0}}, "at least 1"),
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
        ({"lookup_lag": -1}, "lookup_lag must be a number of seconds >= 0"),
        ({"lookup_lag": float("inf")}, "lookup_lag must be a number of seconds >= 0"),
        ({"lookup_lag": "1"}, "lookup_lag must be a number"),
    ],
)
def test_bad_webhook_lookup_settings_say_what_to_fix(spec, message) -> None:
    """A lookup needs a lookup_url with {key}; lookup_lag is seconds >= 0."""
    data = {"channels": {"push": {"url": "http://x", **spec}}}
    with pytest.raises(ConfigError, match=message):
        parse_config(data, source="kirim.toml")
