"""The dashboard's figures: one definition of what each counts, one query for them all.

A delivery counts under exactly one *figure*: its status, except that one sent under
``assumed_sent`` is the figure ``assumed_sent`` (an earlier request may have arrived;
kirim did not send again) and never ``sent``. The figures fall into the chart's
three series (``SERIES``): *sent* (sent, delivered), *failed* (failed, bounced) and
*in doubt* (assumed sent, held in doubt); the rest (waiting, being sent, canceled,
suppressed) are in none. ``Operator.activity`` (the chart's query) counts by the
same rule, at the time each delivery reached its figure; the overview's cards, its
per-channel table and its tables of rows all read ``Figures``, built from one query
(``Operator.figures``: deliveries per channel, status, doubt and latest job status).
A *dead letter* is a delivery whose latest job is dead and that is not held in doubt
(a held one is listed, once, under its doubt).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kirim.model import DeliveryStatus, Doubt, JobStatus

ASSUMED_SENT = "assumed_sent"

#: every figure, in the order the overview shows them, with its label
LABELS: dict[str, str] = {
    "pending": "waiting",
    "processing": "being sent",
    "sent": "sent",
    "delivered": "delivered (confirmed)",
    ASSUMED_SENT: "assumed sent",
    "in_doubt": "held in doubt",
    "failed": "failed",
    "bounced": "bounced",
    "canceled": "canceled",
    "suppressed": "suppressed",
}
#: the chart's series, and the figures each one adds up
SERIES: dict[str, tuple[str, ...]] = {
    "sent": ("sent", "delivered"),
    "failed": ("failed", "bounced"),
    "in_doubt": (ASSUMED_SENT, "in_doubt"),
}
#: how the other names kirim shows read (job statuses, doubts, reasons)
WORDS: dict[str, str] = {
    **LABELS,
    "queued": "queued",
    "running": "running",
    "retry_scheduled": "retry scheduled",
    "completed": "completed",
    "dead": "dead",
    "held": "held",
    "resolved": "resolved",
    "opted_out": "opted out",
    "channel_opted_out": "channel opted out",
    "not_opted_in": "not opted in",
    "throttled": "throttled",
}


def figure_of(status: str, doubt: str | None) -> str:
    """The figure a delivery of ``status`` and ``doubt`` counts under."""
    if status == DeliveryStatus.SENT and doubt == Doubt.ASSUMED_SENT:
        return ASSUMED_SENT
    return str(status)


def word(name: object) -> str:
    """A status, doubt or reason as people read it: ``held in doubt``, ``retry scheduled``."""
    text = str(name)
    return WORDS.get(text, text.replace("_", " "))


@dataclass(frozen=True, slots=True, kw_only=True)
class Figures:
    """The overview's numbers, all from ``Operator.figures``' rows."""

    #: deliveries per figure (every figure, zeros included)
    by_figure: Mapping[str, int]
    #: per channel, deliveries per figure (the figures it has)
    by_channel: Mapping[str, Mapping[str, int]]
    #: dead letters (latest job dead, not held in doubt)
    dead: int
    total: int
    #: the series' totals (``SERIES``)
    series: Mapping[str, int] = field(default_factory=dict)

    @property
    def in_doubt(self) -> int:
        return self.series["in_doubt"]


def figures(rows: Iterable[Mapping[str, Any]]) -> Figures:
    """``Figures`` of the ``figures`` query's rows (channel, status, doubt, job_status, n)."""
    by_figure = dict.fromkeys(LABELS, 0)
    by_channel: dict[str, dict[str, int]] = {}
    dead = total = 0
    for row in rows:
        n = int(row["n"])
        key = figure_of(str(row["status"]), row["doubt"])
        by_figure[key] = by_figure.get(key, 0) + n
        channel = by_channel.setdefault(str(row["channel"]), {})
        channel[key] = channel.get(key, 0) + n
        total += n
        if row["job_status"] == JobStatus.DEAD and row["status"] != DeliveryStatus.IN_DOUBT:
            dead += n
    series = {name: sum(by_figure[f] for f in parts) for name, parts in SERIES.items()}
    return Figures(
        by_figure=by_figure, by_channel=by_channel, dead=dead, total=total, series=series
    )


__all__ = ["LABELS", "SERIES", "Figures", "figure_of", "figures", "word"]
