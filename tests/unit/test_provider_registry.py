"""The provider registry: each built-in provider's module describes its own options."""

from __future__ import annotations

import importlib
import sys

import pytest

from kirim.addresses import kind_of
from kirim.channel_config import COMMON_KEYS, channel_keys
from kirim.config import parse_config
from kirim.errors import ConfigError
from kirim.providers import registry
from kirim.providers.webhook import WebhookProvider


@pytest.mark.parametrize("name", sorted(registry.BUILT_IN))
def test_every_built_in_module_describes_its_options(name: str) -> None:
    """A built-in provider's module has its keys, a check and a builder."""
    module = importlib.import_module(registry.BUILT_IN[name].module)
    assert isinstance(module.KEYS, frozenset)
    assert module.KEYS or name == "inbox"  # the in-app feed takes no option of its own
    assert not module.KEYS & {"provider", "on_unknown", "fallback", "rate"}
    assert callable(module.check_options)
    assert callable(module.from_table)


def test_the_channel_keys_are_the_common_ones_and_every_providers() -> None:
    """A channel table takes the common keys and the keys of any built-in provider."""
    keys = channel_keys()
    assert keys >= COMMON_KEYS
    for name in registry.BUILT_IN:
        assert registry.provider_keys()[name] <= keys


def test_a_key_of_another_provider_is_refused_naming_the_provider() -> None:
    """A webhook channel with an smtp key is refused, the key and the provider named."""
    table = {"url": "http://127.0.0.1:9/x", "host": "mail.example.com"}
    assert registry.check_options("webhook", table) == (
        ": host: not an option of provider 'webhook'"
    )
    with pytest.raises(ConfigError, match=r"channels\.push: host: not an option of provider"):
        parse_config({"channels": {"push": {"provider": "webhook", **table}}})


def test_a_factory_provider_is_not_checked_by_the_registry() -> None:
    """A ``module:factory`` provider's options are its factory's to check."""
    assert registry.check_options("mypkg.mod:make", {"anything": 1}) is None


def test_the_webhook_check_is_in_its_module() -> None:
    """The webhook module says what is wrong with its table, without the prefix."""
    from kirim.providers.webhook import check_options

    assert check_options({}) == "url is required for a webhook (http:// or https://)"
    assert check_options({"url": "http://h/x", "lookup": True}) == (
        "lookup: the webhook provider has no lookup without lookup_url"
    )
    assert check_options({"url": "http://h/x", "headers": {"a": 1}}) == (
        "headers must be a table of strings"
    )
    assert check_options({"url": "http://h/x"}) is None


def test_build_makes_a_built_in_provider_with_the_channels_idempotent_word() -> None:
    """The registry builds a built-in provider from its table; ``idempotent`` is kept."""
    provider = registry.build("webhook", {"url": "http://127.0.0.1:9/x", "idempotent": True})
    assert isinstance(provider, WebhookProvider)
    assert provider.idempotent is True


def test_an_unknown_provider_lists_the_built_in_ones() -> None:
    """A provider name that is neither built in nor module:factory lists the choices."""
    with pytest.raises(ConfigError) as caught:
        registry.build_provider("push", "carrier-pigeon", {})
    assert str(caught.value) == (
        "channels.push.provider must be 'webhook', 'smtp', 'apprise', 'apns', 'fcm', "
        "'webpush', 'twilio', 'slack', 'inbox' or 'package.module:factory'"
    )


@pytest.fixture
def no_jwt(monkeypatch: pytest.MonkeyPatch) -> None:
    """``jwt`` cannot be imported (as when kirim[apns] is not installed)."""
    monkeypatch.setitem(sys.modules, "jwt", None)


def test_a_missing_extra_is_named(no_jwt: None) -> None:
    """A service whose extra is not installed: the error names the extra to install."""
    table = {
        "team_id": "ABCDE12345",
        "key_id": "KEY1234567",
        "private_key": "-----BEGIN PRIVATE KEY-----\n...\n-----END PRIVATE KEY-----",
        "topic": "com.example.app",
    }
    with pytest.raises(ConfigError, match=r"needs the apns extra: pip install 'kirim\[apns\]'"):
        registry.build_provider("ios", "apns", table)


@pytest.mark.parametrize(
    ("kind", "table"),
    [
        ("smtp", {"host": "127.0.0.1", "from": "kirim@example.com"}),
        ("twilio", {"account_sid": "AC1", "auth_token": "t", "from": "+15005550006"}),
        ("slack", {"token": "xoxb-1"}),
        ("slack", {"token": "xoxb-1", "channel": "C0123ABCD"}),
        ("webhook", {"url": "http://127.0.0.1:9/x"}),
    ],
)
def test_a_configured_channel_takes_the_addresses_its_built_provider_takes(
    kind: str, table: dict[str, object]
) -> None:
    """The registry's kind of address for a channel table (read before any provider is
    built) is the one the provider built from that table says it takes."""
    assert registry.check_options(kind, table) is None
    assert registry.address_kind(kind, table) == kind_of(registry.build(kind, table))
