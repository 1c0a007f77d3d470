"""What a burst worker (``kirim worker --burst``) says while it waits.

A burst worker runs until no job is due, running anywhere, or waiting for a retry.
While a retry is not due yet, or another lease still runs, it would sit silent; this
says what it waits for, in one ``burst_waiting`` log line when that changes (and
every ``EVERY`` seconds while it does not): how many retries and when the first is
due, how many deliveries run and when the last lease ends, and how many jobs are
scheduled later (``send_after``), which it does not wait for. ``burst_done`` says
what it leaves behind when it exits.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kirim.store.base import Waiting

#: seconds between two lines that say the same
EVERY = 15.0


def _at(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _in(t: float, now: float) -> str:
    left = max(0.0, t - now)
    return f"{left:.0f} s" if left < 120 else f"{left / 60:.0f} min"


def _n(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def describe(w: Waiting, now: float) -> str:
    """``2 retries (the first due at 20:41:07Z, in 42 s); 1 delivery running (its lease
    ends in 12 s); 3 scheduled later, not waited for (the first at …)``."""
    parts = []
    if w.retries:
        text = _n(w.retries, "retry", "retries")
        if w.next_retry_at is not None:
            text += f" (the first due at {_at(w.next_retry_at)}, in {_in(w.next_retry_at, now)})"
        parts.append(text)
    if w.running:
        text = _n(w.running, "delivery running", "deliveries running")
        if w.lease_ends_at is not None:
            which = "its lease ends" if w.running == 1 else "the last lease ends"
            text += f" ({which} in {_in(w.lease_ends_at, now)})"
        parts.append(text)
    if w.later:
        text = _n(w.later, "job scheduled later", "jobs scheduled later") + ", not waited for"
        if w.next_later_at is not None:
            text += f" (the first at {_at(w.next_later_at)})"
        parts.append(text)
    return "; ".join(parts) or "nothing"


def fields(w: Waiting, now: float) -> dict[str, Any]:
    """The line's fields: counts, times (ISO-8601) and seconds left."""
    out: dict[str, Any] = {"retries": w.retries, "running": w.running, "later": w.later}
    if w.next_retry_at is not None:
        out["next_retry_at"] = _at(w.next_retry_at)
        out["next_retry_in_s"] = round(max(0.0, w.next_retry_at - now), 1)
    if w.lease_ends_at is not None:
        out["lease_ends_at"] = _at(w.lease_ends_at)
    if w.next_later_at is not None:
        out["next_later_at"] = _at(w.next_later_at)
    return out


class BurstProgress:
    """Says what a burst worker waits for, when that changes and every ``EVERY`` s."""

    def __init__(self, log: Any, monotonic: Callable[[], float]) -> None:
        self.log = log
        self._monotonic = monotonic
        self._said: tuple[Any, ...] | None = None
        self._said_at = 0.0

    def waiting(self, w: Waiting, now: float) -> None:
        picture = (w.retries, w.next_retry_at, w.running, w.lease_ends_at, w.later)
        t = self._monotonic()
        if picture == self._said and t - self._said_at < EVERY:
            return
        self._said, self._said_at = picture, t
        self.log.info("burst_waiting", waiting_for=describe(w, now), **fields(w, now))

    def done(self, w: Waiting, now: float) -> None:
        left = describe(w, now) if w.later else "nothing"
        self.log.info("burst_done", left=left, later=w.later, next_later_at=_at(w.next_later_at))
