"""The knobs of a simulation and the parsing of their text forms.

A latency SPEC is one of:

- ``fixed:S`` — every answer after S seconds;
- ``uniform:A:B`` — uniformly between A and B seconds;
- ``lognormal:MEDIAN:P99`` — a log-normal distribution with that median and 99th
  percentile (the long tail real providers have).

A rate is a probability: ``0.01`` or ``1%``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

from kirim.model import OnUnknown

Strategy = Literal["kirim", "naive"]
STRATEGIES: tuple[Strategy, ...] = ("kirim", "naive")
#: what the workers deliver over: HTTP to the webhook receiver, SMTP to a mail server,
#: or a service's loopback fake (``kirim.simulate.services``)
ChannelKind = Literal["webhook", "smtp", "apns", "fcm", "webpush", "sms"]
CHANNELS: tuple[ChannelKind, ...] = ("webhook", "smtp", "apns", "fcm", "webpush", "sms")
_Z99 = NormalDist().inv_cdf(0.99)
_KINDS = "fixed:S, uniform:A:B or lognormal:MEDIAN:P99"


@dataclass(frozen=True, slots=True)
class Latency:
    """A distribution of provider latency, in seconds."""

    kind: Literal["fixed", "uniform", "lognormal"]
    a: float
    b: float = 0.0

    def sample(self, rng: random.Random) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b)
        return rng.lognormvariate(math.log(self.a), self.sigma)

    @property
    def sigma(self) -> float:
        """The log-normal's shape: the spread of ``ln(latency)``."""
        return math.log(self.b / self.a) / _Z99 if self.kind == "lognormal" else 0.0

    @property
    def median(self) -> float:
        """The typical latency: the lease/latency ratio of ``--plot`` is taken against it."""
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{self.a:g}"
        return f"{self.kind}:{self.a:g}:{self.b:g}"


def parse_latency(text: str) -> Latency:
    """``fixed:S``, ``uniform:A:B`` or ``lognormal:MEDIAN:P99``; ValueError says what is wrong."""
    kind, _, rest = text.strip().partition(":")
    kind = kind.lower()
    parts = rest.split(":") if rest else []
    arity = {"fixed": 1, "uniform": 2, "lognormal": 2}
    if kind not in arity:
        raise ValueError(f"{text!r}: unknown distribution {kind!r}; use {_KINDS}")
    if len(parts) != arity[kind]:
        form = {"fixed": "fixed:S", "uniform": "uniform:A:B", "lognormal": "lognormal:MEDIAN:P99"}
        raise ValueError(f"{text!r}: {kind} takes {arity[kind]} number(s): {form[kind]}")
    numbers = []
    for part in parts:
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"{text!r}: {part!r} is not a number of seconds") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{text!r}: {part!r} must be a finite number of seconds >= 0")
        numbers.append(value)
    if kind == "fixed":
        return Latency("fixed", numbers[0])
    low, high = numbers
    if kind == "uniform":
        if high < low:
            raise ValueError(f"{text!r}: uniform:A:B needs A <= B")
        return Latency("uniform", low, high)
    if low <= 0:
        raise ValueError(f"{text!r}: the log-normal median must be greater than 0")
    if high < low:
        raise ValueError(f"{text!r}: the log-normal P99 must be at least the median")
    return Latency("lognormal", low, high)


def parse_rate(text: str, *, name: str = "rate") -> float:
    """A probability, ``0.01`` or ``1%``, between 0 and 1."""
    raw = text.strip()
    percent = raw.endswith("%")
    try:
        value = float(raw[:-1] if percent else raw)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not a number (use 0.01 or 1%)") from None
    if percent:
        value /= 100
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise ValueError(f"{name} {text!r} must be between 0 and 1 (or 0% and 100%)")
    return value


def parse_ratios(text: str) -> tuple[float, ...]:
    """Comma-separated positive numbers: ``0.5,1,2,4``."""
    out = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not a number (use e.g. 0.5,1,2,4)") from None
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"ratio {part.strip()!r} must be greater than 0")
        out.append(value)
    return tuple(sorted(set(out)))


@dataclass(frozen=True, slots=True, kw_only=True)
class SimOptions:
    """Everything one simulation run needs; ``validate()`` raises ValueError on nonsense."""

    strategy: Strategy = "kirim"
    database: str | None = None  # None: a temporary SQLite file
    notifications: int = 500
    workers: int = 4
    concurrency: int = 10
    lease: float = 2.0
    latency: Latency = Latency("lognormal", 0.05, 0.5)
    provider_timeout: float = 5.0
    timeout_rate: float = 0.0
    error_rate: float = 0.0
    kill_rate: float = 0.0
    stall_rate: float = 0.0
    idempotent: bool = False
    on_unknown: OnUnknown = OnUnknown.ASSUME_SENT
    max_attempts: int = 8
    seed: int = 0
    deadline: float = 300.0
    #: each worker process's own clock is off by a draw uniform in ±clock_skew seconds
    clock_skew: float = 0.0
    #: kirim's channel asks the receiver (lookup) when in doubt; the naive flow ignores it
    lookup: bool = False
    #: webhook (the HTTP receiver) or smtp (kirim's smtp provider to an aiosmtpd server)
    channel: ChannelKind = "webhook"

    def validate(self) -> SimOptions:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}")
        for name in ("notifications", "workers", "concurrency", "max_attempts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("lease", "provider_timeout", "deadline"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds")
        for name in ("timeout_rate", "error_rate", "kill_rate", "stall_rate"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be between 0 and 1")
        if self.timeout_rate + self.error_rate > 1:
            raise ValueError("timeout_rate + error_rate must not exceed 1")
        if not math.isfinite(self.clock_skew) or self.clock_skew < 0:
            raise ValueError("clock_skew must be a finite number of seconds >= 0")
        if self.channel not in CHANNELS:
            raise ValueError(f"channel must be one of {', '.join(CHANNELS)}")
        if self.lookup and self.channel == "smtp":
            raise ValueError("lookup needs the webhook channel: SMTP has no lookup")
        if self.lookup and self.channel != "webhook":
            raise ValueError(f"lookup needs the webhook channel: {self.channel} has no lookup")
        if self.lookup and self.idempotent:
            raise ValueError(
                "lookup runs against a receiver that honours no key: drop --idempotent"
            )
        return self

    @property
    def kills(self) -> int:
        """SIGKILLs in this run: the per-delivery rate times the notifications."""
        return round(self.kill_rate * self.notifications)

    @property
    def stalls(self) -> int:
        """SIGSTOP/SIGCONT stalls (each longer than the lease) in this run."""
        return round(self.stall_rate * self.notifications)

    @property
    def hang_s(self) -> float:
        """How long a request that will time out is held: past the client's timeout."""
        return self.provider_timeout + 0.5
