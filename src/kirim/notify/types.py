"""Notification types: what one business event becomes on each channel.

A type names its channels and, per channel, the templates of the message's parts
(``subject``, ``title``, ``body``, ``html``), with optional variants per locale. It
also says what preferences make of it (``critical``, ``defaults``, a send
``window``), and whether its deliveries are throttled or gathered into a digest.
Written in kirim.toml::

    [types.order_shipped]
    default_locale = "en"
    window = "08:00-21:00"                       # the recipient's local time
    throttle = { limit = 3, window = "1h", per = "recipient", over = "suppress" }

    [types.order_shipped.templates.email]
    subject = "Order {{ order_id }} has shipped"
    body = "It left on {{ shipped_at | date }}."
    [types.order_shipped.templates.email.id]     # the variant for locale id
    subject = "Pesanan {{ order_id }} telah dikirim"

or read from files (``template_dir``, relative to kirim.toml): ``email/subject.j2``,
``email/subject.id.j2``, ``push/title.j2``... or built in Python (``NotificationType``,
or ``parse_type`` with the table as a dict). Every template is compiled when the type
is made: a syntax error is a ``ConfigError`` naming the template and line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kirim.errors import ConfigError
from kirim.notify.shapes import JSON_PARTS, check_json_part
from kirim.notify.steps import Step, parse_cancel, parse_steps
from kirim.notify.templates import PARTS, check_syntax, normalize_locale
from kirim.preferences import TypePolicy, Window
from kirim.validation import DAY, BadValue, Number, require_duration

#: a type's name: it appears in keys, throttle scopes, digest streams and metrics
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
WINDOW_RULE = Number(minimum=1, maximum=366 * DAY, unit="seconds")
LIMIT_RULE = Number(minimum=1, maximum=1_000_000, integer=True)
_KEYS = {
    "channels",
    "templates",
    "template_dir",
    "default_locale",
    "critical",
    "defaults",
    "window",
    "throttle",
    "digest",
    "steps",
    "cancel_on",
    "cancel_key",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Templates:
    """One channel's templates: ``parts`` (part -> Jinja source) in the type's default
    locale, and ``locales`` (locale -> some of those parts) for the variants."""

    parts: Mapping[str, str]
    locales: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ThrottleRule:
    """At most ``limit`` deliveries per ``window`` seconds, counted per recipient (on
    each channel), per recipient and type, or per recipient and the value of the data
    field ``key``; over it, the delivery is suppressed (``throttled``) or deferred."""

    limit: int
    window: float
    per: Literal["recipient", "type", "key"] = "recipient"
    key: str | None = None
    over: Literal["suppress", "defer"] = "suppress"


@dataclass(frozen=True, slots=True, kw_only=True)
class DigestRule:
    """The events of each ``window`` seconds go out as one delivery per recipient and
    channel (``key = "recipient"``), or per recipient and value of the data field
    ``key``."""

    window: float
    key: str = "recipient"


@dataclass(frozen=True, slots=True, kw_only=True)
class NotificationType:
    """A notification type. ``templates`` maps each of its channels to its templates
    (the channels are its keys, in order). Checked when made: ``ConfigError``."""

    name: str
    templates: Mapping[str, Templates]
    default_locale: str = "en"
    critical: bool = False
    #: channel -> on/off when the recipient said nothing (absent: on)
    defaults: Mapping[str, bool] = field(default_factory=dict)
    #: the type's own send window, in the recipient's local time
    window: Window | None = None
    throttle: ThrottleRule | None = None
    digest: DigestRule | None = None
    #: a workflow (``kirim.notify.steps``): one run per recipient instead of one
    #: delivery per channel (empty: no workflow)
    steps: tuple[Step, ...] = ()
    #: events that cancel this type's runs whose event had the same ``cancel_key`` value
    cancel_on: tuple[str, ...] = ()
    cancel_key: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME.fullmatch(self.name):
            raise ConfigError(
                f"types.{self.name}: a type's name is letters, digits, '_', '.' or '-' "
                "(at most 64, starting with a letter or digit)"
            )
        where = f"types.{self.name}"
        try:
            object.__setattr__(self, "default_locale", normalize_locale(self.default_locale))
        except ValueError as exc:
            raise ConfigError(f"{where}.default_locale: {exc}") from None
        if not self.templates:
            raise ConfigError(f"{where}: no templates (give at least one channel's)")
        object.__setattr__(
            self,
            "templates",
            {
                ch: _checked(t, self.default_locale, f"{where}.templates.{ch}")
                for ch, t in self.templates.items()
            },
        )
        for channel, value in self.defaults.items():
            if channel not in self.templates:
                raise ConfigError(f"{where}.defaults.{channel}: not a channel of the type")
            if not isinstance(value, bool):
                raise ConfigError(f"{where}.defaults.{channel} must be true or false")
        if self.throttle is not None and self.digest is not None:
            raise ConfigError(
                f"{where}: throttle and digest together (a digest already sends one "
                "delivery per window: drop the throttle)"
            )
        if self.steps and (self.throttle is not None or self.digest is not None):
            raise ConfigError(f"{where}: steps with a throttle or a digest are not supported")
        if self.cancel_on and not self.steps:
            raise ConfigError(f"{where}: cancel_on cancels a workflow's runs: give steps")
        if self.throttle is not None and self.throttle.per == "key" and not self.throttle.key:
            raise ConfigError(f'{where}.throttle: per = "key" needs key = "a data field"')

    @property
    def channels(self) -> tuple[str, ...]:
        return tuple(self.templates)

    @property
    def policy(self) -> TypePolicy:
        """What preferences make of this type (``kirim.preferences.decide``)."""
        return TypePolicy(
            name=self.name, critical=self.critical, defaults=dict(self.defaults), window=self.window
        )


def _checked(templates: Templates, default: str, where: str) -> Templates:
    """``templates`` with its locales in Babel's form, every source compiled."""
    if not isinstance(templates, Templates):
        raise ConfigError(f"{where} must be Templates (or use parse_type with a table)")
    if not templates.parts:
        raise ConfigError(f"{where}: no parts (give {', '.join(PARTS)} or some of them)")
    _check_parts(templates.parts, where)
    locales: dict[str, Mapping[str, str]] = {}
    for name, parts in templates.locales.items():
        try:
            locale = normalize_locale(name)
        except ValueError as exc:
            raise ConfigError(f"{where}.{name}: {exc}") from None
        if locale == default:
            raise ConfigError(
                f"{where}.{name}: {locale} is the type's default locale: write its parts "
                "as the channel's own"
            )
        if locale in locales:
            raise ConfigError(f"{where}.{name}: the variant for {locale} is given twice")
        for part in parts:
            if part in PARTS and part not in templates.parts:
                raise ConfigError(
                    f"{where}.{name}.{part}: the default locale has no {part} to vary"
                )
        _check_parts(parts, f"{where}.{name}")
        locales[locale] = dict(parts)
    return Templates(parts=dict(templates.parts), locales=locales)


def _check_parts(parts: Mapping[str, str], where: str) -> None:
    for part, source in parts.items():
        if part not in PARTS:
            raise ConfigError(f"{where}.{part}: not a part (one of {', '.join(PARTS)})")
        if not isinstance(source, str):
            raise ConfigError(f"{where}.{part} must be a template (a string)")
        if part in JSON_PARTS:
            problem = check_json_part(source, check_syntax)
        else:
            problem = check_syntax(source, html=part == "html")
        if problem is not None:
            raise ConfigError(f"{where}.{part}: {problem}")


# -- kirim.toml's [types.NAME] ---------------------------------------------------------


def parse_types(
    table: Mapping[str, Any], *, where: str = "config", base: Path | None = None
) -> dict[str, NotificationType]:
    """Every ``[types.NAME]`` table as a type; ``base``: where ``template_dir`` is read
    from (the config file's directory)."""
    return {name: parse_type(name, spec, where=where, base=base) for name, spec in table.items()}


def parse_type(
    name: str, spec: Any, *, where: str = "config", base: Path | None = None
) -> NotificationType:
    """One ``[types.NAME]`` table (a dict in Python) as a type; ``ConfigError`` that
    names ``where`` and the key."""
    prefix = f"types.{name}"
    try:
        if not isinstance(spec, Mapping):
            raise ConfigError(f"[{prefix}] must be a table")
        bad = set(spec) - _KEYS
        if bad:
            raise ConfigError(f"unknown [{prefix}] key(s) {', '.join(sorted(bad))}")
        templates = _templates(spec.get("templates", {}), prefix)
        if "template_dir" in spec:
            _merge(templates, _read_dir(spec["template_dir"], base, prefix), prefix)
        channels = spec.get("channels")
        if channels is not None:
            templates = _in_order(templates, channels, prefix)
        if not isinstance(spec.get("critical", False), bool):
            raise ConfigError(f"{prefix}.critical must be true or false")
        defaults = spec.get("defaults", {})
        if not isinstance(defaults, Mapping):
            raise ConfigError(f"{prefix}.defaults must be a table of channel = true/false")
        steps = () if "steps" not in spec else parse_steps(spec["steps"], list(templates), prefix)
        cancel_on, cancel_key = parse_cancel(spec, prefix)
        return NotificationType(
            name=name,
            templates={ch: Templates(parts=p, locales=v) for ch, (p, v) in templates.items()},
            default_locale=spec.get("default_locale", "en"),
            critical=bool(spec.get("critical", False)),
            defaults=dict(defaults),
            window=None if "window" not in spec else parse_window(spec["window"], prefix),
            throttle=None if "throttle" not in spec else _throttle(spec["throttle"], prefix),
            digest=None if "digest" not in spec else _digest(spec["digest"], prefix),
            steps=steps,
            cancel_on=cancel_on,
            cancel_key=cancel_key,
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


_Parsed = dict[str, tuple[dict[str, str], dict[str, dict[str, str]]]]


def _templates(table: Any, prefix: str) -> _Parsed:
    """``templates.CHANNEL = {part = "...", LOCALE = {part = "..."}}``."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{prefix}.templates must be a table of channels")
    out: _Parsed = {}
    for channel, spec in table.items():
        where = f"{prefix}.templates.{channel}"
        if not isinstance(spec, Mapping):
            raise ConfigError(f"[{where}] must be a table of parts ({', '.join(PARTS)})")
        parts: dict[str, str] = {}
        locales: dict[str, dict[str, str]] = {}
        for key, value in spec.items():
            if isinstance(value, Mapping):  # a locale's variant
                locales[key] = dict(value)
            elif key in PARTS:
                parts[key] = value
            else:
                raise ConfigError(
                    f"{where}.{key}: not a part (one of {', '.join(PARTS)}) nor a locale's table"
                )
        out[channel] = (parts, locales)
    return out


def _read_dir(value: Any, base: Path | None, prefix: str) -> _Parsed:
    """``DIR/CHANNEL/PART.j2`` and ``DIR/CHANNEL/PART.LOCALE.j2``."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{prefix}.template_dir must be a directory's path")
    root = Path(value) if base is None else base / value
    if not root.is_dir():
        raise ConfigError(f"{prefix}.template_dir: {str(root)!r} is not a directory")
    out: _Parsed = {}
    for channel_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        parts: dict[str, str] = {}
        locales: dict[str, dict[str, str]] = {}
        for file in sorted(channel_dir.glob("*.j2")):
            part, _, locale = file.name.removesuffix(".j2").partition(".")
            where = f"{prefix}.template_dir: {channel_dir.name}/{file.name}"
            if part not in PARTS:
                raise ConfigError(f"{where}: {part!r} is not a part (one of {', '.join(PARTS)})")
            try:
                text = file.read_text(encoding="utf-8")
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{where}: cannot be read: {exc}") from None
            if locale:
                locales.setdefault(locale, {})[part] = text
            else:
                parts[part] = text
        if parts or locales:
            out[channel_dir.name] = (parts, locales)
    if not out:
        raise ConfigError(f"{prefix}.template_dir: no CHANNEL/PART.j2 files in {str(root)!r}")
    return out


def _merge(into: _Parsed, more: _Parsed, prefix: str) -> None:
    for channel, (parts, locales) in more.items():
        have_parts, have_locales = into.setdefault(channel, ({}, {}))
        for part, text in parts.items():
            if part in have_parts:
                raise ConfigError(f"{prefix}: {channel}.{part} is given inline and as a file")
            have_parts[part] = text
        for locale, variant in locales.items():
            mine = have_locales.setdefault(locale, {})
            for part, text in variant.items():
                if part in mine:
                    raise ConfigError(
                        f"{prefix}: {channel}.{locale}.{part} is given inline and as a file"
                    )
                mine[part] = text


def _in_order(templates: _Parsed, channels: Any, prefix: str) -> _Parsed:
    """The templates of ``channels``, in that order; each listed channel has some."""
    if not isinstance(channels, list) or not all(isinstance(c, str) and c for c in channels):
        raise ConfigError(f"{prefix}.channels must be a list of channel names")
    if len(set(channels)) != len(channels):
        raise ConfigError(f"{prefix}.channels names a channel twice")
    for channel in channels:
        if channel not in templates:
            raise ConfigError(f"{prefix}.channels: {channel!r} has no templates")
    extra = sorted(set(templates) - set(channels))
    if extra:
        raise ConfigError(f"{prefix}.templates.{extra[0]}: not in {prefix}.channels")
    return {channel: templates[channel] for channel in channels}


def parse_window(value: Any, prefix: str) -> Window:
    """``"08:00-21:00"`` (over midnight when the end is earlier: ``"22:00-07:00"``)."""
    try:
        return Window.parse(value, f"{prefix}.window")
    except BadValue as exc:
        raise ConfigError(str(exc)) from None


def _rule_table(value: Any, where: str, keys: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a table")
    bad = set(value) - keys
    if bad:
        raise ConfigError(f"unknown {where} key(s) {', '.join(sorted(bad))}")
    return value


def _duration(where: str, value: Any) -> float:
    try:
        return float(require_duration(where, value, WINDOW_RULE))
    except BadValue as exc:
        raise ConfigError(str(exc)) from None


def _field(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must name a field of the event's data")
    return value


def _throttle(value: Any, prefix: str) -> ThrottleRule:
    """``{limit = 3, window = "1h", per = "recipient", key = "field", over = "suppress"}``."""
    where = f"{prefix}.throttle"
    spec = _rule_table(value, where, {"limit", "window", "per", "key", "over"})
    if "limit" not in spec or "window" not in spec:
        raise ConfigError(f'{where} needs limit and window (limit = 3, window = "1h")')
    try:
        limit = LIMIT_RULE.check(f"{where}.limit", spec["limit"])
    except BadValue as exc:
        raise ConfigError(str(exc)) from None
    per = spec.get("per", "recipient")
    if per not in ("recipient", "type", "key"):
        raise ConfigError(f"{where}.per must be recipient, type or key")
    over = spec.get("over", "suppress")
    if over not in ("suppress", "defer"):
        raise ConfigError(f"{where}.over must be suppress or defer")
    key = spec.get("key")
    if key is not None:
        key = _field(f"{where}.key", key)
        if per != "key":
            raise ConfigError(f'{where}.key is read only with per = "key"')
    return ThrottleRule(
        limit=limit,
        window=_duration(f"{where}.window", spec["window"]),
        per=per,
        key=key,
        over=over,
    )


def _digest(value: Any, prefix: str) -> DigestRule:
    """``{window = "10m", key = "recipient"}`` (or ``key = "a data field"``)."""
    where = f"{prefix}.digest"
    spec = _rule_table(value, where, {"window", "key"})
    if "window" not in spec:
        raise ConfigError(f'{where} needs a window (window = "10m")')
    return DigestRule(
        window=_duration(f"{where}.window", spec["window"]),
        key=_field(f"{where}.key", spec.get("key", "recipient")),
    )
