"""A type's workflow: its ordered ``steps``, and the events that cancel its runs.

Written in kirim.toml (docs/workflows.md)::

    [types.escalate]
    channels = ["inbox", "email"]
    cancel_on = ["order_delivered"]          # events that cancel a run ...
    cancel_key = "order_id"                  # ... whose event had the same order_id
    steps = [
      { send = "inbox" },                    # a channel of the type, its templates
      { delay = "1h" },
      { branch = "unread", step = "inbox" }, # else: the run ends (or: else = "a step")
      { send = "email" },
    ]

Each step is a table with exactly one of ``send``, ``delay``, ``branch`` or ``digest``:

- ``send = CHANNEL``: one delivery on a channel of the type, rendered from its
  templates when the event is recorded; ``name`` (default: the channel) is what a
  branch names it by.
- ``delay = DURATION`` (``"90s"``, ``"1h"``, or seconds), or ``delay = { until =
  "09:00" }``: until the next 09:00 of the recipient's day, in their preferences'
  ``timezone``; for a recipient without one, the step's ``zone`` (an IANA name;
  default UTC). DST: a time the clocks skip fires at the jump, a repeated one at its
  first occurrence (``kirim.day_time``).
- ``branch = CONDITION``: on an earlier send step (``step = NAME``): ``sent``,
  ``delivered``, ``failed``, ``suppressed``, ``in_doubt``, and for the inbox
  ``read``, ``unread``, ``seen``, ``unseen``; or on the event's data:
  ``branch = "data"`` with ``field`` and ``equals``. True: the run goes on with the
  next step; false: it skips to the step named ``else`` (default: it ends).
  ``on_doubt``: what a condition on a step in doubt does, ``"else"`` (the default),
  ``"then"`` or ``"wait"`` (docs/workflows.md says why ``else``).
- ``digest = { window = "1h", key = "recipient" }`` (or ``digest = "1h"``): the runs
  of one recipient (and, with ``key = FIELD``, one value of the event's data field)
  that reach the step within a window are gathered: the oldest goes on, its later
  sends rendered with ``events`` and ``count``; the others end ``joined``. At most one
  per type, a send step after it; with ``cancel_on``, a window also holds only runs of
  one ``cancel_key`` value (``kirim.store.run_digests``).

Everything is checked when the type is made: a ``ConfigError`` names the step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kirim.day_time import DayTime
from kirim.errors import ConfigError
from kirim.preferences import check_timezone
from kirim.validation import DAY, BadValue, Number, require_duration

#: the most steps a type may have
MAX_STEPS = 32
DELAY_RULE = Number(minimum=0, maximum=366 * DAY, unit="seconds")
#: a digest step's window: a second to 31 days
DIGEST_RULE = Number(minimum=1, maximum=31 * DAY, unit="seconds")

#: conditions on an earlier step's delivery
STEP_CONDITIONS = (
    "sent",
    "delivered",
    "failed",
    "suppressed",
    "in_doubt",
    "read",
    "unread",
    "seen",
    "unseen",
)
Doubt = Literal["else", "then", "wait"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Send:
    channel: str
    name: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": "send", "channel": self.channel, "name": self.name}


@dataclass(frozen=True, slots=True, kw_only=True)
class Delay:
    """A wait of ``seconds``, or (``until``, then ``seconds`` is 0) until the next
    ``until`` of the recipient's day, read in ``zone`` when the recipient has none."""

    seconds: float
    name: str
    until: str | None = None
    zone: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "delay", "seconds": self.seconds, "name": self.name}
        if self.until is not None:
            out.update(time_of_day=self.until, zone=self.zone)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Branch:
    condition: str
    name: str
    #: the send step the condition is on (None: ``data``)
    step: str | None = None
    field: str | None = None
    equals: Any = None
    #: the step to skip to when false (None: the run ends)
    otherwise: str | None = None
    on_doubt: Doubt = "else"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "branch",
            "condition": self.condition,
            "name": self.name,
            "step": self.step,
            "field": self.field,
            "equals": self.equals,
            "else": self.otherwise,
            "on_doubt": self.on_doubt,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Digest:
    """The runs of one stream (the type, the recipient, and with ``key`` other than
    ``"recipient"`` the event's ``data[key]``) reaching this step within ``window``
    seconds of the first are gathered into one (``kirim.store.run_digests``)."""

    window: float
    name: str
    key: str = "recipient"

    def to_json(self) -> dict[str, Any]:
        return {"kind": "digest", "window": self.window, "key": self.key, "name": self.name}


Step = Send | Delay | Branch | Digest


class UnreadableStep(ValueError):
    """A run's stored step this kirim cannot read: a kind, or a field, of a newer one
    (a rolling upgrade's newer processes recorded it)."""


def step_from_json(value: Mapping[str, Any]) -> Step:
    """A step as ``to_json`` wrote it (a run keeps its type's steps as they were);
    ``UnreadableStep`` for one of a kind or shape this kirim does not know."""
    try:
        return _step_from_json(value)
    except (KeyError, TypeError, ValueError) as exc:
        raise UnreadableStep(f"a step this kirim cannot read: {value!r}") from exc


def _step_from_json(value: Mapping[str, Any]) -> Step:
    kind = value["kind"]
    if kind not in ("send", "delay", "branch", "digest"):
        raise ValueError(f"unknown step kind {kind!r}")
    if kind == "digest":
        return Digest(window=float(value["window"]), name=value["name"], key=str(value["key"]))
    if kind == "send":
        return Send(channel=value["channel"], name=value["name"])
    if kind == "delay":
        return Delay(
            seconds=float(value["seconds"]),
            name=value["name"],
            until=value.get("time_of_day"),
            zone=value.get("zone"),
        )
    return Branch(
        condition=value["condition"],
        name=value["name"],
        step=value.get("step"),
        field=value.get("field"),
        equals=value.get("equals"),
        otherwise=value.get("else"),
        on_doubt=value.get("on_doubt", "else"),
    )


def parse_steps(value: Any, channels: Sequence[str], prefix: str) -> tuple[Step, ...]:
    """``steps = [...]`` of ``[types.NAME]``, checked against the type's channels."""
    where = f"{prefix}.steps"
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError(f"{where} must be a non-empty list of step tables")
    if len(value) > MAX_STEPS:
        raise ConfigError(f"{where}: at most {MAX_STEPS} steps")
    steps = [_step(item, channels, f"{where}[{i}]", i) for i, item in enumerate(value)]
    names: dict[str, int] = {}
    for i, step in enumerate(steps):
        if step.name in names:
            raise ConfigError(
                f"{where}[{i}]: the name {step.name!r} is step {names[step.name]}'s too "
                "(give one of them name = ...)"
            )
        names[step.name] = i
    for i, step in enumerate(steps):
        if not isinstance(step, Branch):
            continue
        if step.step is not None:
            j = names.get(step.step)
            if j is None or j >= i or not isinstance(steps[j], Send):
                raise ConfigError(
                    f"{where}[{i}].step: {step.step!r} is not an earlier send step's name"
                )
        if step.otherwise is not None:
            j = names.get(step.otherwise)
            if j is None or j <= i:
                raise ConfigError(f"{where}[{i}].else: {step.otherwise!r} is not a later step")
    if not any(isinstance(s, Send) for s in steps):
        raise ConfigError(f"{where}: no send step")
    digests = [i for i, s in enumerate(steps) if isinstance(s, Digest)]
    if len(digests) > 1:
        raise ConfigError(f"{where}[{digests[1]}]: at most one digest step per type")
    if digests and not any(isinstance(s, Send) for s in steps[digests[0] + 1 :]):
        raise ConfigError(
            f"{where}[{digests[0]}]: a digest step needs a send step after it (what it "
            "gathers is sent by one)"
        )
    return tuple(steps)


def digest_of(steps: Sequence[Step]) -> Digest | None:
    """The type's digest step, if it has one."""
    return next((s for s in steps if isinstance(s, Digest)), None)


def _step(item: Any, channels: Sequence[str], where: str, index: int) -> Step:
    if not isinstance(item, Mapping):
        raise ConfigError(
            f"{where} must be a table (send = ..., delay = ..., branch = ... or digest = ...)"
        )
    kinds = [k for k in ("send", "delay", "branch", "digest") if k in item]
    if len(kinds) != 1:
        raise ConfigError(f"{where}: give exactly one of send, delay, branch, digest")
    kind = kinds[0]
    if kind == "delay" and "until" in item:
        raise ConfigError(
            f'{where}: a delay is a duration or until a time, not both: delay = "1h" or '
            'delay = { until = "09:00" }'
        )
    allowed = {
        "send": {"name"},
        "delay": {"name"},
        "branch": set(_BRANCH_KEYS),
        "digest": {"name"},
    }[kind]
    bad = set(item) - allowed - {kind}
    if bad:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(bad))} for a {kind} step")
    name = item.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigError(f"{where}.name must be a non-empty string")
    if kind == "send":
        channel = item["send"]
        if channel not in channels:
            raise ConfigError(
                f"{where}.send: {channel!r} is not a channel of the type "
                f"({', '.join(channels)}): give its templates"
            )
        return Send(channel=channel, name=name or channel)
    if kind == "digest":
        return _digest(item["digest"], f"{where}.digest", name or f"digest{index}")
    if kind == "delay" and isinstance(item["delay"], Mapping):
        return _until(item["delay"], f"{where}.delay", name or f"delay{index}")
    if kind == "delay":
        try:
            seconds = require_duration(f"{where}.delay", item["delay"], DELAY_RULE)
        except BadValue as exc:
            raise ConfigError(str(exc)) from None
        return Delay(seconds=seconds, name=name or f"delay{index}")
    return _branch(item, where, name or f"branch{index}")


def _until(spec: Mapping[str, Any], where: str, name: str) -> Delay:
    """``delay = { until = "HH:MM", zone = "Europe/Berlin" }``."""
    bad = set(spec) - {"until", "zone"}
    if bad & {"seconds", "after", "for", "duration"}:
        raise ConfigError(f"{where}: a delay is a duration or until a time, not both")
    if bad:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(bad))} (until, zone)")
    if "until" not in spec:
        raise ConfigError(f'{where}: a delay table needs until = "HH:MM" (or: delay = "1h")')
    try:
        until = str(DayTime.parse(spec["until"], f"{where}.until"))
        zone = spec.get("zone")
        if zone is not None:
            try:
                zone = check_timezone(zone)
            except BadValue as exc:
                raise BadValue(f"{where}.zone", exc.reason) from None
    except BadValue as exc:
        raise ConfigError(str(exc)) from None
    return Delay(seconds=0.0, name=name, until=until, zone=zone)


def _digest(spec: Any, where: str, name: str) -> Digest:
    """``digest = "1h"`` or ``digest = { window = "1h", key = "recipient" }``."""
    if not isinstance(spec, Mapping):
        spec = {"window": spec}
    bad = set(spec) - {"window", "key"}
    if bad:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(bad))} (window, key)")
    if "window" not in spec:
        raise ConfigError(f'{where}: a digest table needs window = "1h"')
    try:
        window = require_duration(f"{where}.window", spec["window"], DIGEST_RULE)
    except BadValue as exc:
        raise ConfigError(str(exc)) from None
    key = spec.get("key", "recipient")
    if not isinstance(key, str) or not key:
        raise ConfigError(f'{where}.key must be "recipient" or a data field\'s name')
    return Digest(window=window, name=name, key=key)


_BRANCH_KEYS = ("name", "step", "field", "equals", "else", "on_doubt")


def _branch(item: Mapping[str, Any], where: str, name: str) -> Branch:
    condition = item["branch"]
    on_doubt = item.get("on_doubt", "else")
    if on_doubt not in ("else", "then", "wait"):
        raise ConfigError(f'{where}.on_doubt must be "else", "then" or "wait"')
    otherwise = item.get("else")
    if otherwise is not None and not isinstance(otherwise, str):
        raise ConfigError(f"{where}.else must be a step's name")
    if condition == "data":
        field = item.get("field")
        if not isinstance(field, str) or not field or "equals" not in item:
            raise ConfigError(f'{where}: branch = "data" needs field = "..." and equals = ...')
        if "step" in item:
            raise ConfigError(f'{where}: branch = "data" is on the event, not on a step')
        return Branch(
            condition="data",
            name=name,
            field=field,
            equals=item["equals"],
            otherwise=otherwise,
            on_doubt=on_doubt,
        )
    if condition not in STEP_CONDITIONS:
        raise ConfigError(
            f"{where}.branch: {condition!r} is not a condition "
            f"(one of {', '.join(STEP_CONDITIONS)}, or data)"
        )
    step = item.get("step")
    if not isinstance(step, str) or not step:
        raise ConfigError(f'{where}: branch = "{condition}" needs step = "an earlier send step"')
    if "field" in item or "equals" in item:
        raise ConfigError(f'{where}: field and equals are for branch = "data"')
    return Branch(condition=condition, name=name, step=step, otherwise=otherwise, on_doubt=on_doubt)


def parse_cancel(spec: Mapping[str, Any], prefix: str) -> tuple[tuple[str, ...], str | None]:
    """``cancel_on`` (event names) and ``cancel_key`` (a data field) of a type."""
    events = spec.get("cancel_on", [])
    if not isinstance(events, list | tuple) or not all(isinstance(e, str) and e for e in events):
        raise ConfigError(f"{prefix}.cancel_on must be a list of event names")
    key = spec.get("cancel_key")
    if key is not None and (not isinstance(key, str) or not key):
        raise ConfigError(f"{prefix}.cancel_key must be a data field's name")
    if events and key is None:
        raise ConfigError(f'{prefix}: cancel_on needs cancel_key = "a data field"')
    if key is not None and not events:
        raise ConfigError(f"{prefix}: cancel_key without cancel_on")
    return tuple(events), key


__all__ = [
    "Branch",
    "Delay",
    "Digest",
    "Send",
    "Step",
    "digest_of",
    "parse_cancel",
    "parse_steps",
    "step_from_json",
]
