"""The built-in providers by their ``[channels.NAME] provider = "..."`` name.

Each provider module describes its own options: ``KEYS`` (the keys of a channel's
table it takes besides the common ones: ``timeout``, ``idempotent``, ``lookup``…),
``check_options(table)`` (what is wrong with them, or None) and ``from_table(table)``
(its provider, from a checked table). This module maps a name to that module, knows
the extra each needs installed, and builds a channel's provider: a built-in one, or
``package.module:factory`` called with the channel's options.

```toml
[channels.ios]
provider = "apns"              # kirim[apns]
team_id = "ABCDE12345"
key_id = "KEY1234567"
private_key_file = "/etc/kirim/AuthKey_KEY1234567.p8"
topic = "com.example.app"      # the app's bundle id
environment = "production"     # or "sandbox"

[channels.android]
provider = "fcm"               # kirim[fcm]
service_account_file = "/etc/kirim/firebase.json"

[channels.browser]
provider = "webpush"           # kirim[webpush]
vapid_private_key_file = "/etc/kirim/vapid.pem"
vapid_subject = "mailto:ops@example.com"

[channels.sms]
provider = "twilio"            # httpx only
account_sid = "AC…"
auth_token = "…"
from = "+15005550006"

[channels.chat]
provider = "slack"             # httpx only
token = "xoxb-…"
```

Credentials (``password``, ``secret``, ``token``, ``private_key``,
``service_account``, ``vapid_private_key``, ``auth_token``) are never shown: not in a
``repr``, not in an error.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

from kirim.channels import provider_problem
from kirim.errors import ConfigError
from kirim.providers.base import Provider


class ProviderModule(Protocol):
    """What a built-in provider's module offers the registry."""

    KEYS: frozenset[str]

    def check_options(self, options: Mapping[str, Any]) -> str | None: ...

    def from_table(self, options: Mapping[str, Any]) -> Provider: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One built-in provider: its module, the extra it needs (None: none), and the kind
    of address its channels take (``kirim.addresses.KINDS``; None: any text)."""

    module: str
    extra: str | None = None
    address_kind: str | None = None
    #: the option that, when set, fixes where every message goes: then no address
    fixed_by: str | None = None

    def load(self) -> ProviderModule:
        return cast(ProviderModule, importlib.import_module(self.module))


#: the built-in providers, in the order error messages list them
BUILT_IN: Mapping[str, Entry] = {
    "webhook": Entry(module="kirim.providers.webhook"),
    "smtp": Entry(module="kirim.providers.smtp", address_kind="email"),
    "apprise": Entry(module="kirim.providers.apprise_bridge"),  # says its extra itself
    "apns": Entry(module="kirim.providers.apns", extra="apns", address_kind="apns"),
    "fcm": Entry(module="kirim.providers.fcm", extra="fcm", address_kind="fcm"),
    "webpush": Entry(module="kirim.providers.webpush", extra="webpush", address_kind="webpush"),
    "twilio": Entry(module="kirim.providers.twilio", address_kind="phone"),
    "slack": Entry(module="kirim.providers.slack", address_kind="slack", fixed_by="channel"),
    "inbox": Entry(module="kirim.providers.inbox"),  # the in-app feed
}


@functools.cache
def provider_keys() -> Mapping[str, frozenset[str]]:
    """The keys each built-in provider takes besides the common ones."""
    return {name: entry.load().KEYS for name, entry in BUILT_IN.items()}


def all_keys() -> frozenset[str]:
    """Every key some built-in provider takes."""
    return frozenset().union(*provider_keys().values())


def address_kind(provider: str, options: Mapping[str, Any]) -> str | None:
    """The kind of address a configured channel takes (``[channels.NAME]``'s
    ``provider`` and options), without building its provider: a built-in's, unless
    an option fixes where it sends (a Slack ``channel``); None for any text."""
    entry = BUILT_IN.get(provider)
    if entry is None or (entry.fixed_by is not None and options.get(entry.fixed_by)):
        return None
    return entry.address_kind


def check_options(provider: str, table: Mapping[str, Any]) -> str | None:
    """What is wrong with a built-in provider's channel table, or None: a key of
    another provider's first, then the provider's own checks. None for a
    ``module:factory`` provider (its factory checks its own options)."""
    entry = BUILT_IN.get(provider)
    if entry is None:
        return None
    keys = provider_keys()
    others = frozenset().union(*(k for p, k in keys.items() if p != provider))
    stray = sorted(set(table) & (others - keys[provider]))
    if stray:
        return f": {', '.join(stray)}: not an option of provider {provider!r}"
    problem = entry.load().check_options(table)
    return None if problem is None else f".{problem}"


def build_provider(channel: str, kind: str, options: Mapping[str, Any]) -> Provider:
    """The provider of channel ``channel``: a built-in ``kind`` from its checked
    options, or ``package.module:factory`` called with them (ConfigError, never
    showing an option's value: it may be a secret)."""
    entry = BUILT_IN.get(kind)
    if entry is not None:
        try:
            return _built_in(kind, entry, options)
        except (ValueError, KeyError) as exc:
            what = f"{exc.args[0]} is required" if isinstance(exc, KeyError) else str(exc)
            raise ConfigError(f"channels.{channel}: {what}") from None
    module_name, _, attr = kind.partition(":")
    if not attr:
        names = ", ".join(f"'{name}'" for name in BUILT_IN)
        raise ConfigError(
            f"channels.{channel}.provider must be {names} or 'package.module:factory'"
        )
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"channels.{channel}.provider {kind!r}: {exc}") from None
    try:
        provider: Provider = factory(**options)
    except Exception as exc:  # the factory is user code: its failure is a config error
        raise ConfigError(f"channels.{channel}.provider {kind!r} failed: {exc}") from None
    if (problem := provider_problem(provider)) is not None:
        raise ConfigError(f"channels.{channel}.provider {kind!r} returned {problem}")
    return provider


def build(kind: str, options: Mapping[str, Any]) -> Provider:
    """The built-in provider ``kind`` of a checked table; ValueError (never showing a
    credential), naming the extra to install when it is missing."""
    return _built_in(kind, BUILT_IN[kind], options)


def _built_in(kind: str, entry: Entry, options: Mapping[str, Any]) -> Provider:
    module = entry.load()
    if entry.extra is None:
        provider = module.from_table(options)
    else:
        try:
            provider = module.from_table(options)
        except ImportError as exc:
            raise ValueError(
                f"the {kind} provider needs the {entry.extra} extra: "
                f"pip install 'kirim[{entry.extra}]' ({exc.name or exc} is missing)"
            ) from None
    if "idempotent" in options:  # the channel's own word over the provider's default
        provider.idempotent = bool(options["idempotent"])
    return provider
