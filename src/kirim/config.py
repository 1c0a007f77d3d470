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

``KIRIM_DATABASE_URL`` overrides ``database``.
"""

from __future__ import annotations

import importlib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kirim.channels import Channel
from kirim.errors import ConfigError
from kirim.model import OnUnknown
from kirim.providers.base import Provider
from kirim.worker import WorkerSettings

DEFAULT_DATABASE = "sqlite:///kirim.db"
DEFAULT_MAX_PAYLOAD = 256 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelConfig:
    name: str
    provider: str = "webhook"
    on_unknown: OnUnknown = OnUnknown.ASSUME_SENT
    lookup: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    #: seconds the provider remembers an idempotency key (checked by `kirim doctor`)
    dedup_window: float | None = None

    def build(self) -> Channel:
        return Channel(
            name=self.name,
            provider=build_provider(self.name, self.provider, self.options),
            on_unknown=self.on_unknown,
            lookup=self.lookup,
        )


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    database: str = DEFAULT_DATABASE
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD
    max_attempts: int = 8
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    channels: Mapping[str, ChannelConfig] = field(default_factory=dict)
    source: str | None = None
    serve: ServeSettings = field(default_factory=ServeSettings)


_WORKER_KEYS = {f.name for f in fields(WorkerSettings)} | {"max_attempts"}
_CHANNEL_KEYS = {
    "provider",
    "on_unknown",
    "lookup",
    "url",
    "timeout",
    "idempotent",
    "headers",
    "token",
    "dedup_window",
    "lookup_url",
    "lookup_lag",
}


def load_config(path: str | Path | None = None, *, database: str | None = None) -> Config:
    """Read ``path`` (or ``./kirim.toml`` if it exists); apply the environment and overrides."""
    data: dict[str, Any] = {}
    source = None
    if path is not None or Path("kirim.toml").exists():
        file = Path(path) if path is not None else Path("kirim.toml")
        try:
            data = tomllib.loads(file.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {str(file)!r} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from None
        source = str(file)
    return parse_config(data, database=database, source=source)


def parse_config(
    data: Mapping[str, Any], *, database: str | None = None, source: str | None = None
) -> Config:
    where = source or "config"
    unknown = set(data) - {"database", "max_payload_bytes", "worker", "channels", "serve"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    db = database or os.environ.get("KIRIM_DATABASE_URL") or data.get("database")
    worker_data = dict(_table(data, "worker", where))
    bad = set(worker_data) - _WORKER_KEYS
    if bad:
        raise ConfigError(f"{where}: unknown [worker] key(s) {', '.join(sorted(bad))}")
    max_attempts = _number(worker_data.pop("max_attempts", 8), "worker.max_attempts", where)
    if max_attempts < 1:
        raise ConfigError(f"{where}: worker.max_attempts must be at least 1")
    for key, value in worker_data.items():
        _number(value, f"worker.{key}", where)
    try:
        worker = WorkerSettings(**worker_data)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: [worker]: {exc}") from None
    channels = {
        name: _channel(name, spec, where) for name, spec in _table(data, "channels", where).items()
    }
    limit = _number(data.get("max_payload_bytes", DEFAULT_MAX_PAYLOAD), "max_payload_bytes", where)
    return Config(
        database=str(db or DEFAULT_DATABASE),
        max_payload_bytes=int(limit),
        max_attempts=int(max_attempts),
        worker=worker,
        channels=channels,
        source=source,
        serve=_serve(_table(data, "serve", where), where),
    )


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
    return ServeSettings(
        host=host,
        port=port,
        protect_metrics=bool(spec.get("protect_metrics", False)),
        protect_dashboard=bool(spec.get("protect_dashboard", False)),
        max_body_bytes=limit,
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
        if k not in ("provider", "on_unknown", "lookup", "dedup_window")
    }
    prefix = f"{where}: channels.{name}"
    if not isinstance(provider, str):
        raise ConfigError(f"{prefix}.provider must be a string")
    if not isinstance(spec.get("lookup", False), bool):
        raise ConfigError(f"{prefix}.lookup must be true or false")
    if not isinstance(spec.get("idempotent", False), bool):
        raise ConfigError(f"{prefix}.idempotent must be true or false")
    if "timeout" in spec and _number(spec["timeout"], f"channels.{name}.timeout", where) <= 0:
        raise ConfigError(f"{prefix}.timeout must be positive")
    window = spec.get("dedup_window")
    if window is not None and _number(window, f"channels.{name}.dedup_window", where) <= 0:
        raise ConfigError(f"{prefix}.dedup_window must be positive (seconds)")
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
        if not 0 <= _number(lag, f"channels.{name}.lookup_lag", where) < float("inf"):
            raise ConfigError(f"{prefix}.lookup_lag must be a number of seconds >= 0")
        headers = spec.get("headers", {})
        if not isinstance(headers, Mapping) or not all(
            isinstance(v, str) for v in headers.values()
        ):
            raise ConfigError(f"{prefix}.headers must be a table of strings")
        if not isinstance(spec.get("token", ""), str):
            raise ConfigError(f"{prefix}.token must be a string")
    return ChannelConfig(
        name=name,
        provider=provider,
        on_unknown=on_unknown,
        lookup=bool(spec.get("lookup", False)),
        options=options,
        dedup_window=None if window is None else float(window),
    )


def build_provider(channel: str, kind: str, options: Mapping[str, Any]) -> Provider:
    """``webhook``, or ``module:factory`` called with the channel's options."""
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
        )
    module_name, _, attr = kind.partition(":")
    if not attr:
        raise ConfigError(
            f"channels.{channel}.provider must be 'webhook' or 'package.module:factory'"
        )
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"channels.{channel}.provider {kind!r}: {exc}") from None
    provider: Provider = factory(**options)
    return provider


def _table(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: [{key}] must be a table")
    return value


def _number(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {key} must be a number, not {value!r}")
    return value
