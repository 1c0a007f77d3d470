"""Configuration: ``kirim.toml`` (or ``--config FILE``), then the environment.

```toml
database = "sqlite:///kirim.db"
[worker]
lease = 30
max_attempts = 8
[channels.push]
provider = "webhook"
url = "http://127.0.0.1:8080/push"
timeout = 10
idempotent = true
on_unknown = "assume_sent"   # or "hold", "retry"
# lookup = true               # a webhook needs lookup_url = "http://…/lookup/{key}"
```

``[types.NAME]`` tables are notification types (``kirim.notify.types``).
``KIRIM_DATABASE_URL`` overrides ``database``; ``listen_url`` (or
``KIRIM_LISTEN_URL``) is a direct PostgreSQL connection for LISTEN only, for a
``database`` reached through a pooler in transaction mode.
"""

from __future__ import annotations

import importlib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kirim.addresses import configured_kind, fallback_problem
from kirim.callbacks import CallbackAuth, token_problem
from kirim.channels import Channel, provider_problem
from kirim.errors import ConfigError
from kirim.model import OnUnknown
from kirim.notify.types import NotificationType, parse_types
from kirim.providers import services
from kirim.providers.base import Provider
from kirim.providers.dedup import window_of
from kirim.providers.signing import decode_secret
from kirim.validation import DAY, BadValue, Number, check_rules, check_text, require_duration
from kirim.worker.settings import RULES as WORKER_RULES
from kirim.worker.settings import WorkerSettings

DEFAULT_DATABASE = "sqlite:///kirim.db"
DEFAULT_MAX_PAYLOAD = 256 * 1024

#: the top-level numbers (``max_attempts`` is written in ``[worker]``)
RULES: Mapping[str, Number] = {
    "max_payload_bytes": Number(minimum=1, maximum=2**30, integer=True),
    "max_attempts": Number(minimum=1, maximum=1000, integer=True),
}
#: the numbers of a ``[channels.NAME]`` table
CHANNEL_RULES: Mapping[str, Number] = {
    "timeout": Number(minimum=0, above=True, maximum=DAY, unit="seconds"),
    "dedup_window": Number(minimum=0, above=True, maximum=3650 * DAY, unit="seconds"),
    "lookup_lag": Number(minimum=0, maximum=DAY, unit="seconds"),
    "rate": Number(minimum=0, above=True, maximum=1_000_000, unit="requests per second"),
}
#: ``[serve] allowed_hosts`` by default: the loopback names
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelConfig:
    name: str
    provider: str = "webhook"
    on_unknown: OnUnknown = OnUnknown.ASSUME_SENT
    lookup: bool = False
    #: not in repr: they hold passwords, secrets and tokens
    options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: seconds the provider remembers an idempotency key (checked by `kirim doctor`)
    dedup_window: float | None = None
    #: the channels tried, in order, after this one certainly did not accept a delivery
    fallback: tuple[str, ...] = ()
    #: delivery callbacks (``kirim.callbacks``): Standard Webhooks secrets, or a token
    callback_secret: tuple[str, ...] = field(default=(), repr=False)
    callback_token: str | None = field(default=None, repr=False)
    #: the provider's request rate (requests per second), shared by every worker
    rate: float | None = None

    def build(self) -> Channel:
        return Channel(
            name=self.name,
            provider=build_provider(self.name, self.provider, self.options),
            on_unknown=self.on_unknown,
            lookup=self.lookup,
            dedup_window=self.dedup_window,
            fallback=self.fallback,
            callback=self.callback_auth(),
            rate=self.rate,
        )

    def callback_auth(self) -> CallbackAuth | None:
        """How the channel's delivery callbacks are verified; None: they are off."""
        if not self.callback_secret and self.callback_token is None:
            return None
        return CallbackAuth(secrets=self.callback_secret, token=self.callback_token)


@dataclass(frozen=True, slots=True, kw_only=True)
class InboxSettings:
    """The ``[inbox]`` table: how a browser reads its recipient's feed (``kirim.inbox``)."""

    #: the server secret that signs feed tokens (``KIRIM_INBOX_SECRET`` overrides it);
    #: None: no feed token can be issued or accepted. Never shown
    secret: str | None = field(default=None, repr=False)
    #: the web origins (``https://app.example``) whose pages may call the feed API
    #: (CORS); none by default
    allowed_origins: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeSettings:
    """The ``[serve]`` table: ``kirim serve``'s defaults (its flags override them)."""

    host: str = "127.0.0.1"
    port: int = 8000
    #: /metrics needs a bearer token too
    protect_metrics: bool = False
    #: the dashboard needs a token (a login form sets a cookie)
    protect_dashboard: bool = False
    #: request bodies over this are refused with 413
    max_body_bytes: int = 1024 * 1024
    #: ``Host`` names (any port) an unprotected dashboard answers: a page reached
    #: through another name (DNS rebinding) is refused; ``"*"`` allows any
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    database: str = DEFAULT_DATABASE
    #: PostgreSQL: where the workers LISTEN for wake-ups (None: on ``database``); a
    #: direct connection when ``database`` goes through a pooler in transaction mode
    listen_url: str | None = None
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD
    max_attempts: int = 8
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    channels: Mapping[str, ChannelConfig] = field(default_factory=dict)
    source: str | None = None
    serve: ServeSettings = field(default_factory=ServeSettings)
    #: notification types (``[types.NAME]``, ``kirim.notify.types``): notify_event's
    types: Mapping[str, NotificationType] = field(default_factory=dict)
    #: the in-app inbox (``[inbox]``): the feed tokens' secret, the browsers' origins
    inbox: InboxSettings = field(default_factory=InboxSettings)

    def __post_init__(self) -> None:
        check_rules(
            RULES, {"max_payload_bytes": self.max_payload_bytes, "max_attempts": self.max_attempts}
        )


#: the ``[retention]`` table's keys (durations such as "30d", or seconds) and the
#: WorkerSettings fields they set
_RETENTION_KEYS = {
    "keep": "retention_keep",
    "keys": "retention_keys",
    "archived": "retention_archived",
}
#: the ``[worker]`` table's keys (the retention settings are written in [retention])
_WORKER_KEYS = {f.name for f in fields(WorkerSettings)} - set(_RETENTION_KEYS.values())
_WORKER_KEYS.add("max_attempts")
_CHANNEL_KEYS = {
    "rate",
    "provider",
    "on_unknown",
    "lookup",
    "url",
    "timeout",
    "idempotent",
    "headers",
    "token",
    "dedup_window",
    "dedup",
    "lookup_url",
    "lookup_lag",
    # webhook: Standard Webhooks signing, failure classes per status
    "secret",
    "retry_on",
    "ambiguous_on",
    "permanent_on",
    # smtp
    "host",
    "port",
    "security",
    "username",
    "password",
    "from",
    "local_hostname",
    "ca_file",
    # apprise
    "urls",
    # failover: other channels, tried when this one certainly did not accept it
    "fallback",
    # delivery callbacks (POST /v1/callbacks/NAME), any provider
    "callback_secret",
    "callback_token",
    # apns, fcm, webpush, twilio, slack (kirim.providers.services)
    *services.KEYS,
}
#: the keys only one built-in provider takes (the others take the common ones)
_PROVIDER_KEYS = {
    "webhook": frozenset(
        {"url", "headers", "token", "lookup_url", "lookup_lag", "secret"}
        | {"retry_on", "ambiguous_on", "permanent_on"}
    ),
    "smtp": frozenset(
        {"host", "port", "security", "username", "password", "from", "local_hostname"} | {"ca_file"}
    ),
    "apprise": frozenset({"urls"}),
    "inbox": frozenset(),
    **services.PROVIDER_KEYS,
}


def load_config(path: str | Path | None = None, *, database: str | None = None) -> Config:
    """Read ``path`` (or ``./kirim.toml`` if it exists); apply the environment and overrides."""
    data: dict[str, Any] = {}
    source = None
    if path is not None or Path("kirim.toml").exists():
        file = Path(path) if path is not None else Path("kirim.toml")
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {str(file)!r} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from None
        except (OSError, ValueError) as exc:  # a directory, no permission, a NUL, not UTF-8
            raise ConfigError(f"cannot read the config file {str(file)!r}: {exc}") from None
        source = str(file)
    return parse_config(data, database=database, source=source)


def parse_config(
    data: Mapping[str, Any], *, database: str | None = None, source: str | None = None
) -> Config:
    where = source or "config"
    unknown = set(data) - {
        "database",
        "listen_url",
        "max_payload_bytes",
        "worker",
        "channels",
        "serve",
        "retention",
        "types",
        "inbox",
    }
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    db = database or os.environ.get("KIRIM_DATABASE_URL") or data.get("database")
    if db is not None:  # --database, KIRIM_DATABASE_URL or the file: a URL no path call refuses
        check_text("database URL", db)
    listen = _listen_url(
        os.environ.get("KIRIM_LISTEN_URL") or data.get("listen_url"), db or DEFAULT_DATABASE, where
    )
    worker_data = dict(_table(data, "worker", where))
    bad = set(worker_data) - _WORKER_KEYS
    if bad:
        raise ConfigError(f"{where}: unknown [worker] key(s) {', '.join(sorted(bad))}")
    max_attempts = _valid(
        RULES["max_attempts"], worker_data.pop("max_attempts", 8), "worker.max_attempts", where
    )
    worker_data.update(_retention(_table(data, "retention", where), where))
    try:
        worker = WorkerSettings(**worker_data)
    except BadValue as exc:
        raise ConfigError(f"{where}: worker.{exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: [worker]: {exc}") from None
    channels = {
        name: _channel(name, spec, where) for name, spec in _table(data, "channels", where).items()
    }
    _check_fallbacks(channels, where)
    types = _types(_table(data, "types", where), channels, where, source)
    limit = _valid(
        RULES["max_payload_bytes"],
        data.get("max_payload_bytes", DEFAULT_MAX_PAYLOAD),
        "max_payload_bytes",
        where,
    )
    return Config(
        database=str(db or DEFAULT_DATABASE),
        listen_url=listen,
        max_payload_bytes=limit,
        max_attempts=max_attempts,
        worker=worker,
        channels=channels,
        source=source,
        serve=_serve(_table(data, "serve", where), where),
        types=types,
        inbox=_inbox(_table(data, "inbox", where), where),
    )


def _listen_url(value: Any, database: str, where: str) -> str | None:
    """``listen_url``: a postgresql:// URL, beside a PostgreSQL ``database``."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.startswith(("postgresql:", "postgres:")):
        raise ConfigError(
            f"{where}: listen_url must be a postgresql:// URL (a direct connection to the "
            "database's server, for LISTEN only)"
        )
    check_text("listen_url", value)
    if not database.startswith(("postgresql:", "postgres:")):
        raise ConfigError(f"{where}: listen_url is for a PostgreSQL database only")
    return value


def _types(
    table: Mapping[str, Any], channels: Mapping[str, ChannelConfig], where: str, source: str | None
) -> dict[str, NotificationType]:
    """``[types.NAME]`` (template_dir read beside the config file); each type's
    channels are configured ones."""
    base = None if source is None else Path(source).parent
    types = parse_types(table, where=where, base=base)
    for name, ntype in types.items():
        for channel in ntype.channels:
            if channel not in channels:
                raise ConfigError(f"{where}: types.{name}: no channel {channel!r} is configured")
    return types


def _retention(spec: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``[retention] keep`` and ``keys`` as WorkerSettings' fields, in seconds."""
    bad = set(spec) - set(_RETENTION_KEYS)
    if bad:
        raise ConfigError(f"{where}: unknown [retention] key(s) {', '.join(sorted(bad))}")
    found = {}
    for key, name in _RETENTION_KEYS.items():
        if key in spec:
            try:
                found[name] = require_duration(f"retention.{key}", spec[key], WORKER_RULES[name])
            except BadValue as exc:
                raise ConfigError(f"{where}: {exc}") from None
    return found


#: the shortest feed-token secret kirim accepts (characters)
MIN_INBOX_SECRET = 16


def _inbox(spec: Mapping[str, Any], where: str) -> InboxSettings:
    """``[inbox] secret`` (or ``KIRIM_INBOX_SECRET``) and ``allowed_origins``, checked
    without ever showing the secret."""
    bad = set(spec) - {"secret", "allowed_origins"}
    if bad:
        raise ConfigError(f"{where}: unknown [inbox] key(s) {', '.join(sorted(bad))}")
    secret = os.environ.get("KIRIM_INBOX_SECRET") or spec.get("secret")
    if secret is not None and (
        not isinstance(secret, str) or len(secret) < MIN_INBOX_SECRET or not secret.isprintable()
    ):
        raise ConfigError(
            f"{where}: inbox.secret (or KIRIM_INBOX_SECRET) must be printable text of at "
            f"least {MIN_INBOX_SECRET} characters (such as 32 random bytes in hex)"
        )
    origins = spec.get("allowed_origins", [])
    if not isinstance(origins, list) or not all(_origin(o) for o in origins):
        raise ConfigError(
            f"{where}: inbox.allowed_origins must be a list of web origins "
            '(such as ["https://app.example"]: a scheme, a host, an optional port)'
        )
    return InboxSettings(secret=secret or None, allowed_origins=tuple(origins))


def _origin(value: Any) -> bool:
    """A web origin as CORS compares it: ``scheme://host[:port]``, nothing after."""
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        return False
    rest = value.split("://", 1)[1]
    return bool(rest) and _host_name(rest.replace(":", "", 1)) and value.isascii()


def _serve(spec: Mapping[str, Any], where: str) -> ServeSettings:
    bad = set(spec) - {f.name for f in fields(ServeSettings)}
    if bad:
        raise ConfigError(f"{where}: unknown [serve] key(s) {', '.join(sorted(bad))}")
    host = spec.get("host", "127.0.0.1")
    if not isinstance(host, str) or not host:
        raise ConfigError(f"{where}: serve.host must be a host name or address")
    port = spec.get("port", 8000)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"{where}: serve.port must be a port number (0-65535)")
    for flag in ("protect_metrics", "protect_dashboard"):
        if not isinstance(spec.get(flag, False), bool):
            raise ConfigError(f"{where}: serve.{flag} must be true or false")
    limit = spec.get("max_body_bytes", 1024 * 1024)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1024:
        raise ConfigError(f"{where}: serve.max_body_bytes must be an integer of at least 1024")
    hosts = spec.get("allowed_hosts", list(LOOPBACK_HOSTS))
    if not isinstance(hosts, list) or not hosts or not all(_host_name(h) for h in hosts):
        raise ConfigError(
            f"{where}: serve.allowed_hosts must be a non-empty list of host names "
            '(such as ["127.0.0.1", "localhost", "::1"]; "*" allows any)'
        )
    return ServeSettings(
        host=host,
        port=port,
        protect_metrics=bool(spec.get("protect_metrics", False)),
        protect_dashboard=bool(spec.get("protect_dashboard", False)),
        max_body_bytes=limit,
        allowed_hosts=tuple(hosts),
    )


def _host_name(value: Any) -> bool:
    """A ``Host`` name or address as ``allowed_hosts`` lists it (no port, no path)."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= 255
        and value.isascii()
        and value.isprintable()
        and not any(c in value for c in " /@,")
    )


def _channel(name: str, spec: Any, where: str) -> ChannelConfig:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: [channels.{name}] must be a table")
    bad = set(spec) - _CHANNEL_KEYS
    if bad:
        raise ConfigError(f"{where}: unknown [channels.{name}] key(s) {', '.join(sorted(bad))}")
    try:
        on_unknown = OnUnknown(spec.get("on_unknown", "assume_sent"))
    except ValueError:
        raise ConfigError(
            f"{where}: channels.{name}.on_unknown must be assume_sent, hold or retry"
        ) from None
    provider = spec.get("provider", "webhook")
    options = {
        k: v
        for k, v in spec.items()
        if k
        not in (
            *("provider", "on_unknown", "lookup", "dedup_window", "dedup", "fallback", "rate"),
            *("callback_secret", "callback_token"),
        )
    }
    prefix = f"{where}: channels.{name}"
    if not isinstance(provider, str):
        raise ConfigError(f"{prefix}.provider must be a string")
    if not isinstance(spec.get("lookup", False), bool):
        raise ConfigError(f"{prefix}.lookup must be true or false")
    if not isinstance(spec.get("idempotent", False), bool):
        raise ConfigError(f"{prefix}.idempotent must be true or false")
    if "timeout" in spec:
        _valid(CHANNEL_RULES["timeout"], spec["timeout"], f"channels.{name}.timeout", where)
    if "rate" in spec:
        _valid(CHANNEL_RULES["rate"], spec["rate"], f"channels.{name}.rate", where)
    window = spec.get("dedup_window")
    if window is not None:
        _valid(CHANNEL_RULES["dedup_window"], window, f"channels.{name}.dedup_window", where)
    if "dedup" in spec:
        if window is not None:
            raise ConfigError(f"{where}: channels.{name}: give dedup or dedup_window, not both")
        if not isinstance(spec["dedup"], str):
            raise ConfigError(f"{where}: channels.{name}.dedup must be a provider's name")
        try:
            window = window_of(spec["dedup"])
        except ValueError as exc:
            raise ConfigError(f"{where}: channels.{name}.dedup: {exc}") from None
    if provider == "webhook":
        if not isinstance(options.get("url"), str) or not options["url"].startswith(
            ("http://", "https://")
        ):
            raise ConfigError(f"{prefix}.url is required for a webhook (http:// or https://)")
        lookup_url = spec.get("lookup_url")
        if lookup_url is not None and (
            not isinstance(lookup_url, str)
            or not lookup_url.startswith(("http://", "https://"))
            or "{key}" not in lookup_url
        ):
            raise ConfigError(
                f"{prefix}.lookup_url must be an http:// or https:// URL with {{key}} in it"
            )
        if spec.get("lookup") and lookup_url is None:
            raise ConfigError(
                f"{prefix}.lookup: the webhook provider has no lookup without lookup_url"
            )
        lag = spec.get("lookup_lag", 0)
        _valid(CHANNEL_RULES["lookup_lag"], lag, f"channels.{name}.lookup_lag", where)
        headers = spec.get("headers", {})
        if not isinstance(headers, Mapping) or not all(
            isinstance(v, str) for v in headers.values()
        ):
            raise ConfigError(f"{prefix}.headers must be a table of strings")
        if not isinstance(spec.get("token", ""), str):
            raise ConfigError(f"{prefix}.token must be a string")
    if provider in _PROVIDER_KEYS:
        _provider_options(provider, spec, prefix)
    secrets, token = _callback_keys(spec, prefix)
    return ChannelConfig(
        name=name,
        provider=provider,
        on_unknown=on_unknown,
        lookup=bool(spec.get("lookup", False)),
        options=options,
        dedup_window=None if window is None else float(window),
        fallback=_fallback(name, spec.get("fallback", []), prefix),
        callback_secret=secrets,
        callback_token=token,
        rate=None if spec.get("rate") is None else float(spec["rate"]),
    )


def _callback_keys(spec: Mapping[str, Any], prefix: str) -> tuple[tuple[str, ...], str | None]:
    """``callback_secret`` (one ``whsec_…`` or a list) and ``callback_token``, checked
    without ever showing them; at most one of the two."""
    secret = spec.get("callback_secret")
    token = spec.get("callback_token")
    if secret is not None and token is not None:
        raise ConfigError(f"{prefix}: give callback_secret or callback_token, not both")
    secrets: tuple[str, ...] = ()
    if secret is not None:
        listed = [secret] if isinstance(secret, str) else secret
        if not isinstance(listed, list) or not listed:
            raise ConfigError(f"{prefix}.callback_secret must be a whsec_ secret or a list of them")
        for item in listed:
            try:
                decode_secret(item)
            except ValueError as exc:
                raise ConfigError(f"{prefix}.callback_secret: {exc}") from None
        secrets = tuple(listed)
    if token is not None and (problem := token_problem(token)) is not None:
        raise ConfigError(f"{prefix}.{problem}")
    return secrets, token


def _fallback(name: str, value: Any, prefix: str) -> tuple[str, ...]:
    """``fallback = ["other", ...]``: other channels' names, each once."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{prefix}.fallback must be a list of channel names")
    if name in value:
        raise ConfigError(f"{prefix}.fallback names the channel itself")
    for other in value:
        if value.count(other) > 1:
            raise ConfigError(f"{prefix}.fallback names {other!r} twice")
    return tuple(value)


def _check_fallbacks(channels: Mapping[str, ChannelConfig], where: str) -> None:
    """Every fallback names a configured channel, and no chain of fallbacks comes back
    to where it started (a delivery follows only its own channel's list, never a
    fallback's fallbacks: a cycle can only be a mistake)."""
    for name, channel in channels.items():
        for other in channel.fallback:
            if other not in channels:
                raise ConfigError(
                    f"{where}: channels.{name}.fallback: no channel {other!r} is configured"
                )
            spec = channels[other]
            problem = fallback_problem(
                name,
                configured_kind(channel.provider, channel.options),
                other,
                configured_kind(spec.provider, spec.options),
            )
            if problem is not None:
                raise ConfigError(f"{where}: {problem}")
    for name in channels:
        cycle = _cycle_from([name], channels)
        if cycle is not None:
            raise ConfigError(
                f"{where}: channels.{name}.fallback: a cycle of fallbacks " + " -> ".join(cycle)
            )


def _cycle_from(path: list[str], channels: Mapping[str, ChannelConfig]) -> list[str] | None:
    """A cycle through ``path[0]`` reachable by fallbacks from ``path[-1]``, if any."""
    for other in channels[path[-1]].fallback:
        if other == path[0]:
            return [*path, other]
        if other not in path:
            found = _cycle_from([*path, other], channels)
            if found is not None:
                return found
    return None


def _provider_options(provider: str, spec: Mapping[str, Any], prefix: str) -> None:
    """The checks of one built-in provider's own options (ConfigError on the first)."""
    others = frozenset().union(*(k for p, k in _PROVIDER_KEYS.items() if p != provider))
    stray = sorted(set(spec) & (others - _PROVIDER_KEYS[provider]))
    if stray:
        raise ConfigError(f"{prefix}: {', '.join(stray)}: not an option of provider {provider!r}")
    if provider in services.PROVIDER_KEYS:
        if (problem := services.check_options(provider, spec)) is not None:
            raise ConfigError(f"{prefix}.{problem}")
        return
    if provider != "webhook" and spec.get("lookup"):
        raise ConfigError(f"{prefix}.lookup: the {provider} provider has no lookup")
    if provider == "inbox":
        if spec.get("idempotent") is False:
            raise ConfigError(
                f"{prefix}.idempotent: an inbox channel is idempotent by construction "
                "(its message is written once per key, in the commit that marks it sent)"
            )
        return
    if provider == "webhook":
        from kirim.providers.webhook import check_options
    elif provider == "smtp":
        from kirim.providers.smtp import check_options
    else:
        from kirim.providers.apprise_bridge import check_options
    if (problem := check_options(spec)) is not None:
        raise ConfigError(f"{prefix}.{problem}")


def build_provider(channel: str, kind: str, options: Mapping[str, Any]) -> Provider:
    """``webhook``, ``smtp``, ``apprise``, a service (``apns``, ``fcm``, ``webpush``,
    ``twilio``, ``slack``), ``inbox`` (the in-app feed), or ``module:factory`` called
    with the channel's options."""
    try:
        if kind in services.BUILDERS:
            return services.build(kind, options)
        if kind == "inbox":
            from kirim.providers.inbox import InboxProvider

            return InboxProvider()
        if kind == "webhook":
            from kirim.providers.webhook import WebhookProvider

            return WebhookProvider(
                options["url"],
                timeout=float(options.get("timeout", 10)),
                idempotent=bool(options.get("idempotent", False)),
                headers=dict(options.get("headers", {})),
                token=options.get("token"),
                lookup_url=options.get("lookup_url"),
                lookup_lag=float(options.get("lookup_lag", 0)),
                secret=options.get("secret"),
                retry_on=options.get("retry_on", ()),
                ambiguous_on=options.get("ambiguous_on", ()),
                permanent_on=options.get("permanent_on", ()),
            )
        if kind == "smtp":
            from kirim.providers.smtp import SmtpProvider

            return SmtpProvider(
                host=options["host"],
                port=options.get("port"),
                security=options.get("security", "starttls"),
                username=options.get("username"),
                password=options.get("password"),
                from_address=options["from"],
                timeout=float(options.get("timeout", 30)),
                idempotent=bool(options.get("idempotent", False)),
                local_hostname=options.get("local_hostname"),
                ca_file=options.get("ca_file"),
            )
        if kind == "apprise":
            from kirim.providers.apprise_bridge import AppriseProvider

            return AppriseProvider(
                options["urls"],
                timeout=float(options.get("timeout", 10)),
                idempotent=bool(options.get("idempotent", False)),
            )
    except (ValueError, KeyError) as exc:  # never the values: they may be secrets
        what = f"{exc.args[0]} is required" if isinstance(exc, KeyError) else str(exc)
        raise ConfigError(f"channels.{channel}: {what}") from None
    module_name, _, attr = kind.partition(":")
    if not attr:
        raise ConfigError(
            f"channels.{channel}.provider must be 'webhook', 'smtp', 'apprise', 'apns', "
            "'fcm', 'webpush', 'twilio', 'slack', 'inbox' or 'package.module:factory'"
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


def _table(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: [{key}] must be a table")
    return value


def _valid(rule: Number, value: Any, name: str, where: str) -> Any:
    """``value`` checked by ``rule``; a ConfigError that names ``where`` and ``name``."""
    try:
        return rule.check(name, value)
    except BadValue as exc:
        raise ConfigError(f"{where}: {exc}") from None
