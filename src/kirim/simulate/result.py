"""What one simulation run found, in total (each notification judged by ``kirim.chaos``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from kirim.model import OnUnknown


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    strategy: str
    backend: str
    seed: int
    idempotent: bool
    on_unknown: str
    lease: float
    latency: str
    notifications: int
    delivered: int
    duplicate_requests: int
    duplicates: int
    lost: int
    in_doubt: int
    unreported_in_doubt: int
    failed: int
    unfinished: int
    retries: int
    dead_lettered: int
    seconds: float
    throughput_per_s: float
    latency_p50_s: float | None
    latency_p99_s: float | None
    faults: dict[str, int]
    workers_started: int
    worker_crashes: list[str] = field(default_factory=list)
    timed_out: bool = False
    #: deliveries whose doubt was settled as sent (a late success or a lookup that found it)
    resolved: int = 0
    #: each worker's clock was off by a draw in ±clock_skew seconds (``clock_offsets``,
    #: by worker id; empty without skew)
    clock_skew: float = 0.0
    clock_offsets: dict[str, float] = field(default_factory=dict)
    #: kirim's channel asked the receiver before resending (``lookups``: its answers)
    lookup: bool = False
    lookups: dict[str, int] = field(default_factory=dict)
    #: what was delivered over: "webhook" (HTTP) or "smtp" (email to aiosmtpd)
    channel: str = "webhook"

    @property
    def promise_kept(self) -> bool | None:
        """kirim's promise (None for the naive baseline, which makes none).

        Nothing lost, every unresolved doubt reported, and no duplicate unless the
        channel chose at-least-once (``on_unknown = "retry"`` without idempotency).
        """
        if self.strategy != "kirim":
            return None
        at_least_once = not self.idempotent and self.on_unknown == OnUnknown.RETRY.value
        return (
            not self.timed_out
            and self.lost == 0
            and self.unreported_in_doubt == 0
            and (self.duplicates == 0 or at_least_once)
        )

    def as_json(self) -> dict[str, Any]:
        """Every field, and ``promise_kept``."""
        return {**asdict(self), "promise_kept": self.promise_kept}


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
