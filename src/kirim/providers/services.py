"""The push, SMS and chat services as ``[channels.NAME]`` providers: their kirim.toml
keys, their checks and how each is built (``kirim.config`` asks here).

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

The credentials (``private_key``, ``service_account``, ``vapid_private_key``,
``auth_token``, ``token``) are never shown: not in a ``repr``, not in an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kirim.providers.base import Provider

#: the keys each service provider takes besides the common ones (timeout, idempotent…)
PROVIDER_KEYS: dict[str, frozenset[str]] = {
    "apns": frozenset(
        {"team_id", "key_id", "private_key", "private_key_file", "topic", "environment"}
        | {"push_type", "priority", "expiration", "ca_file", "url"}
    ),
    "fcm": frozenset({"service_account_file", "service_account", "project_id", "url"}),
    "webpush": frozenset(
        {"vapid_private_key", "vapid_private_key_file", "vapid_subject", "ttl", "urgency"}
    ),
    "twilio": frozenset(
        {"account_sid", "auth_token", "from", "messaging_service_sid", "status_callback", "url"}
    ),
    "slack": frozenset({"token", "channel", "url", "lookup_window"}),
}
PROVIDER_KEYS = {k: v | {"user_agent"} for k, v in PROVIDER_KEYS.items()}
KEYS = frozenset().union(*PROVIDER_KEYS.values())
#: the extra each needs installed (None: httpx, which kirim always has)
EXTRAS = {"apns": "apns", "fcm": "fcm", "webpush": "webpush", "twilio": None, "slack": None}
#: the providers whose ``lookup`` works (with the option that makes it possible)
LOOKUP = {"slack": "channel"}


def check_options(provider: str, options: Mapping[str, Any]) -> str | None:
    """What is wrong with one service channel's options, or None."""
    if provider == "apns":
        from kirim.providers.apns import check_options as check
    elif provider == "fcm":
        from kirim.providers.fcm import check_options as check
    elif provider == "webpush":
        from kirim.providers.webpush import check_options as check
    elif provider == "twilio":
        from kirim.providers.twilio import check_options as check
    else:
        from kirim.providers.slack import check_options as check
    if options.get("lookup") and not options.get(LOOKUP.get(provider, "")):
        needs = LOOKUP.get(provider)
        return (
            f"lookup: the {provider} provider has no lookup"
            if needs is None
            else f"lookup: the {provider} provider looks up only with a fixed {needs}"
        )
    return check(options)


def _read(options: Mapping[str, Any], inline: str, file: str) -> str:
    if options.get(file) is not None:
        try:
            return Path(options[file]).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"{file} cannot be read: {exc.strerror}") from None
    return str(options[inline])


def _apns(o: Mapping[str, Any]) -> Provider:
    from kirim.providers.apns import ApnsProvider

    return ApnsProvider(
        team_id=o["team_id"],
        key_id=o["key_id"],
        private_key=_read(o, "private_key", "private_key_file"),
        topic=o["topic"],
        environment=o.get("environment", "production"),
        url=o.get("url"),
        push_type=o.get("push_type", "alert"),
        priority=o.get("priority"),
        expiration=o.get("expiration"),
        timeout=float(o.get("timeout", 10)),
        user_agent=o.get("user_agent"),
        ca_file=o.get("ca_file"),
    )


def _fcm(o: Mapping[str, Any]) -> Provider:
    from kirim.providers.fcm import URL, FcmProvider, read_account

    return FcmProvider(
        account=read_account(o),
        project_id=o.get("project_id"),
        url=o.get("url", URL),
        timeout=float(o.get("timeout", 10)),
        user_agent=o.get("user_agent"),
    )


def _webpush(o: Mapping[str, Any]) -> Provider:
    from kirim.providers.webpush import WebPushProvider, vapid_key

    return WebPushProvider(
        vapid_private_key=vapid_key(o),
        vapid_subject=o["vapid_subject"],
        ttl=int(o.get("ttl", 86400)),
        urgency=o.get("urgency", "normal"),
        timeout=float(o.get("timeout", 10)),
        user_agent=o.get("user_agent"),
    )


def _twilio(o: Mapping[str, Any]) -> Provider:
    from kirim.providers.twilio import URL, TwilioProvider

    return TwilioProvider(
        account_sid=o["account_sid"],
        auth_token=o["auth_token"],
        from_number=o.get("from"),
        messaging_service_sid=o.get("messaging_service_sid"),
        status_callback=o.get("status_callback"),
        url=o.get("url", URL),
        timeout=float(o.get("timeout", 10)),
        user_agent=o.get("user_agent"),
    )


def _slack(o: Mapping[str, Any]) -> Provider:
    from kirim.providers.slack import URL, SlackProvider

    return SlackProvider(
        token=o["token"],
        channel=o.get("channel"),
        url=o.get("url", URL),
        timeout=float(o.get("timeout", 10)),
        user_agent=o.get("user_agent"),
        lookup_window=float(o.get("lookup_window", 86400)),
    )


BUILDERS: dict[str, Callable[[Mapping[str, Any]], Provider]] = {
    "apns": _apns,
    "fcm": _fcm,
    "webpush": _webpush,
    "twilio": _twilio,
    "slack": _slack,
}


def build(kind: str, options: Mapping[str, Any]) -> Provider:
    """The provider of one service channel; ValueError (never showing a credential),
    ImportError naming the extra when it is not installed."""
    try:
        provider = BUILDERS[kind](options)
    except ImportError as exc:
        extra = EXTRAS[kind]
        raise ValueError(
            f"the {kind} provider needs the {extra} extra: pip install 'kirim[{extra}]' "
            f"({exc.name or exc} is missing)"
        ) from None
    if "idempotent" in options:  # the channel's own word over the service's default
        provider.idempotent = bool(options["idempotent"])
    return provider
