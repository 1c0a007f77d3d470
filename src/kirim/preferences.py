"""Recipient preferences and the rule that reads them (no I/O).

CONTRACT STUB (issue 15): the names and signatures below are what the rest of kirim
codes against; the helper that owns this module fills in the bodies and may add
names, but keeps these.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import time
from typing import Any, Literal


class Reason(enum.StrEnum):
    """Why a delivery is ``suppressed`` (its ``reason`` column)."""

    OPTED_OUT = "opted_out"  # the recipient opted out of everything
    CHANNEL_OPTED_OUT = "channel_opted_out"  # ... of this type on this channel
    NOT_OPTED_IN = "not_opted_in"  # the type is off by default on this channel
    THROTTLED = "throttled"  # over the type's throttle


@dataclass(frozen=True, slots=True)
class Window:
    """A daily span of local time, ``start`` to ``end`` (over midnight when end < start)."""

    start: time
    end: time


@dataclass(frozen=True, slots=True, kw_only=True)
class Preferences:
    """One recipient's choices. ``channels`` maps ``"type:channel"``, ``"type:*"`` or
    ``"*:channel"`` to on/off (the most specific wins); ``quiet_hours`` is in
    ``timezone`` (an IANA name; None: UTC)."""

    recipient_id: str
    opt_out: bool = False
    channels: dict[str, bool] = field(default_factory=dict)
    timezone: str | None = None
    quiet_hours: Window | None = None
    updated_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def from_json(recipient_id: str, value: Any, *, updated_at: float | None = None) -> Preferences:
        """Raises ``ValueError`` with the field named when ``value`` is not valid."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True, kw_only=True)
class TypePolicy:
    """What a notification type says about preferences: ``critical`` types ignore
    opt-outs and quiet hours; ``defaults`` (channel -> on/off) apply when the recipient
    said nothing (absent: on); ``window``: the type's own send window (local time of
    the recipient)."""

    name: str
    critical: bool = False
    defaults: dict[str, bool] = field(default_factory=dict)
    window: Window | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """``send`` now; ``suppress`` with ``reason``; ``defer`` until ``until`` (epoch s)."""

    action: Literal["send", "suppress", "defer"]
    reason: Reason | None = None
    until: float | None = None


def decide(policy: TypePolicy, channel: str, prefs: Preferences | None, now: float) -> Verdict:
    """Whether a delivery of ``policy``'s type on ``channel`` goes now, is suppressed,
    or waits for the recipient's send window (quiet hours and the type's window, in
    the recipient's time zone, DST-correct)."""
    raise NotImplementedError
