"""Clock skew for the simulation: a worker's own clock, shifted, and the offsets of a run.

``kirim worker --clock-offset S`` (hidden) and the naive worker's ``--clock-offset S``
run on an ``OffsetClock``: the system clock shifted by S seconds, as on a host whose
clock is S seconds off. kirim's store keeps the database's time regardless, so only
what the worker decides by its own clock moves; the naive flow decides its leases by
it. ``Offsets`` draws each worker process's offset for ``kirim simulate
--clock-skew``.
"""

from __future__ import annotations

import asyncio
import math
import random
import time


class OffsetClock:
    """The system clock shifted by ``offset`` seconds; sleeps and durations are real."""

    def __init__(self, offset: float) -> None:
        if not math.isfinite(offset):
            raise ValueError(f"a clock offset must be a finite number of seconds, not {offset!r}")
        self.offset = float(offset)

    def now(self) -> float:
        """Epoch seconds as this host believes them."""
        return time.time() + self.offset

    def monotonic(self) -> float:
        """Durations are not skewed: a host whose clock is off still counts seconds."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return f"OffsetClock({self.offset:+g})"


class Offsets:
    """The clock offsets of a run's worker processes: each uniform in ±``skew`` seconds.

    Drawn from a generator of their own, seeded by the run's seed, so that a run with
    skew keeps the fault plan and the receiver's draws of the same seed without it."""

    def __init__(self, skew: float, seed: int) -> None:
        if not math.isfinite(skew) or skew < 0:
            raise ValueError(f"clock skew must be a finite number of seconds >= 0, not {skew!r}")
        self.skew = float(skew)
        self._rng = random.Random(f"kirim-simulate-clock-skew:{seed}")

    def draw(self) -> float:
        """The next worker's offset, to the millisecond (0 without skew)."""
        return round(self._rng.uniform(-self.skew, self.skew), 3) if self.skew > 0 else 0.0
