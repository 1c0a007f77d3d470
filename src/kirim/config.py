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

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kirim.channel_config import ChannelConfig, parse_channels
from kirim.errors import ConfigError
from kirim.notify.types import NotificationType, parse_types
from kirim.providers.registry import build_provider
from kirim.validation import BadValue, Number, check_rules, check_text, require_duration
from kirim.worker.settings import RULES as WORKER_RULES
from kirim.worker.settings import WorkerSettings

__all__ = [
    "ChannelConfig",
    "Config",
    "ServeSettings",
    "build_provider",
    "load_config",
    "parse_config",
]

DEFAULT_DATABASE = "sqlite:///kirim.db"
DEFAULT_MAX_PAYLOAD = 256 * 1024

#: the top-level numbers (``max_attempts`` is written in ``[worker]``)
RULES: Mapping[str, Number] = {
    "max_payload_bytes": Number(minimum=1, maximum=2**30, integer=True),
    "max_attempts": Number(minimum=1, maximum=1000, integer=True),
}
#: ``[serve] allowed_hosts`` by default: the loopback names
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


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
    channels = parse_channels(_table(data, "channels", where), where)
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
