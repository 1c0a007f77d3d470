"""A ``[channels.NAME]`` table of kirim.toml: the keys every channel takes (its
in-doubt policy, dedup window, fallbacks, callbacks, rate), checked here; the
provider's own keys are checked by its module (``kirim.providers.registry``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kirim.addresses import fallback_problem
from kirim.callbacks import CallbackAuth, token_problem
from kirim.channels import RATE, Channel, fallback_list_problem
from kirim.errors import ConfigError
from kirim.model import OnUnknown
from kirim.providers.dedup import window_of
from kirim.providers.registry import address_kind, all_keys, build_provider, check_options
from kirim.providers.signing import decode_secret
from kirim.validation import DAY, BadValue, Number

#: the numbers of a ``[channels.NAME]`` table
CHANNEL_RULES: Mapping[str, Number] = {
    "timeout": Number(minimum=0, above=True, maximum=DAY, unit="seconds"),
    "dedup_window": Number(minimum=0, above=True, maximum=3650 * DAY, unit="seconds"),
    "rate": RATE,
}


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


#: the keys every ``[channels.NAME]`` table may have, whatever its provider
COMMON_KEYS = frozenset(
    {"provider", "on_unknown", "lookup", "timeout", "idempotent", "rate"}
    | {"dedup_window", "dedup"}
    # failover: other channels, tried when this one certainly did not accept it
    | {"fallback"}
    # delivery callbacks (POST /v1/callbacks/NAME), any provider
    | {"callback_secret", "callback_token"}
)
#: the keys a channel's provider is not given (the channel's own)
_CHANNEL_ONLY = (
    *("provider", "on_unknown", "lookup", "dedup_window", "dedup", "fallback", "rate"),
    *("callback_secret", "callback_token"),
)


def channel_keys() -> frozenset[str]:
    """Every key a ``[channels.NAME]`` table may have: the common ones and each
    built-in provider's."""
    return COMMON_KEYS | all_keys()


def parse_channels(table: Mapping[str, Any], where: str) -> dict[str, ChannelConfig]:
    """The ``[channels]`` table: each channel checked, then their fallbacks."""
    channels = {name: parse_channel(name, spec, where) for name, spec in table.items()}
    check_fallbacks(channels, where)
    return channels


def parse_channel(name: str, spec: Any, where: str) -> ChannelConfig:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: [channels.{name}] must be a table")
    bad = set(spec) - channel_keys()
    if bad:
        raise ConfigError(f"{where}: unknown [channels.{name}] key(s) {', '.join(sorted(bad))}")
    try:
        on_unknown = OnUnknown(spec.get("on_unknown", "assume_sent"))
    except ValueError:
        raise ConfigError(
            f"{where}: channels.{name}.on_unknown must be assume_sent, hold or retry"
        ) from None
    provider = spec.get("provider", "webhook")
    options = {k: v for k, v in spec.items() if k not in _CHANNEL_ONLY}
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
    if (problem := check_options(provider, spec)) is not None:
        raise ConfigError(f"{prefix}{problem}")
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
    if (problem := fallback_list_problem(name, value)) is not None:
        raise ConfigError(f"{prefix}.{problem}")
    return tuple(value)


def check_fallbacks(channels: Mapping[str, ChannelConfig], where: str) -> None:
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
                address_kind(channel.provider, channel.options),
                other,
                address_kind(spec.provider, spec.options),
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


def _valid(rule: Number, value: Any, name: str, where: str) -> Any:
    """``value`` checked by ``rule``; a ConfigError that names ``where`` and ``name``."""
    try:
        return rule.check(name, value)
    except BadValue as exc:
        raise ConfigError(f"{where}: {exc}") from None
