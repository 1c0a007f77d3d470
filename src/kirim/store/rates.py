"""A channel's provider request rate (``rate`` in kirim.toml, requests per second),
shared by every worker on one database (``kirim_rates``), written once for both
backends.

The channel's row holds the time its next request may leave. Taking a slot is one
upsert: the slot is that time, or now if it has passed; the row moves on by
``1 / rate``. The row's lock orders the takers (PostgreSQL: every host on the
database; SQLite: every process on the file), so no two get one slot.
"""

from __future__ import annotations

import math

from kirim.store.sequence import TIME, Operation, Query

__all__ = ["take_slot"]


def take_slot(channel: str, rate: float, given: float) -> Operation[float]:
    """Take ``channel``'s next slot at ``rate`` requests per second: the seconds from
    now (store time) until it, 0 when it is now. ValueError for a rate that is not a
    positive number."""
    if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"channel {channel!r}: rate must be a positive number, not {rate!r}")
    at = yield TIME
    now = at(given)
    [row] = yield Query("take_rate_slot", {"channel": channel, "interval": 1.0 / rate, "now": now})
    return max(0.0, float(row["wait"]))
