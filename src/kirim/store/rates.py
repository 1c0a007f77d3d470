"""A channel's provider request rate (``rate`` in kirim.toml, requests per second),
shared by every worker on one database (``kirim_rates``), written once for both
backends.

The channel's row holds the time its next request may leave. Taking a slot is one
upsert: the slot is that time, or now if it has passed; the row moves on by
``1 / rate``. The row's lock orders the takers (PostgreSQL: every host on the
database; SQLite: every process on the file), so no two get one slot.

A taker says how long it can wait (``within``: a claim, until its send deadline). A
slot further away is not taken: the row does not move, and the taker learns how far
the slot is, to come back then. (A slot taken and not used would be lost: with a
backlog, every later slot would be further away than any claim can wait, and the
channel would stop for good.) So every slot taken is used, up to a claim lost
meanwhile, and the channel runs at its rate whatever its backlog.
"""

from __future__ import annotations

import math

from kirim.store.sequence import TIME, Operation, Query

__all__ = ["take_slot"]

#: "however far" for a taker that can wait for any slot
FAR = 1e18


def take_slot(
    channel: str, rate: float, given: float, within: float | None = None
) -> Operation[float]:
    """Take ``channel``'s next slot at ``rate`` requests per second if it is at most
    ``within`` seconds away (None: however far): the seconds from now (store time)
    until it, 0 when it is now. A slot further than ``within`` is not taken: the
    answer (larger than ``within``) says how far it is. ValueError for a rate that is
    not a positive number."""
    if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"channel {channel!r}: rate must be a positive number, not {rate!r}")
    at = yield TIME
    now = at(given)
    reach = FAR if within is None else max(0.0, within)
    args = {"channel": channel, "interval": 1.0 / rate, "now": now, "within": reach}
    taken = yield Query("take_rate_slot", args)
    if taken:
        return max(0.0, float(taken[0]["wait"]))
    [row] = yield Query("rate_slot_wait", {"channel": channel, "now": now})
    return max(float(row["wait"]), reach + 1e-9)
