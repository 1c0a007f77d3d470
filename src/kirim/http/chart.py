"""The overview's activity chart: buckets in, an inline SVG string out (no I/O, no
JavaScript).

Each bucket of ``Operator.activity`` is one stacked bar: sent (green), failed (red),
in doubt (amber). The SVG carries its own text alternative, a ``<title>`` and a
``<desc>`` saying the totals and the busiest bucket, and every bar a ``<title>`` (the
browser's tooltip); the page adds the same numbers as a table. Every piece of text is
escaped here, so the SVG may be inserted into a page as it is (``Markup``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from kirim.store.base import ActivityBucket

WIDTH, HEIGHT = 760, 220
LEFT, RIGHT, TOP, BOTTOM = 44, 22, 28, 26
#: series, bottom to top of each bar: (field, label, colour)
SERIES = (
    ("sent", "sent", "#1a7f37"),
    ("failed", "failed", "#cf222e"),
    ("in_doubt", "in doubt", "#bf8700"),
)
#: the spacing of the time axis' labels, in seconds (the first that gives <= 8 labels)
TICKS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


@dataclass(frozen=True, slots=True, kw_only=True)
class Totals:
    sent: int
    failed: int
    in_doubt: int
    #: the most deliveries of one bucket (all three kinds), and that bucket's start
    peak: int
    peak_at: float | None


def totals(buckets: Sequence[ActivityBucket]) -> Totals:
    """The sums of every series, and the busiest bucket (the first of equals)."""
    peak, peak_at = 0, None
    for b in buckets:
        n = b.sent + b.failed + b.in_doubt
        if n > peak:
            peak, peak_at = n, b.start
    return Totals(
        sent=sum(b.sent for b in buckets),
        failed=sum(b.failed for b in buckets),
        in_doubt=sum(b.in_doubt for b in buckets),
        peak=peak,
        peak_at=peak_at,
    )


def per(bucket: float) -> str:
    """A bucket's width in words: ``minute``, ``5 minutes``, ``hour``, ``90 s``."""
    if bucket == 60:
        return "minute"
    if bucket == 3600:
        return "hour"
    if bucket % 3600 == 0:
        return f"{bucket / 3600:g} hours"
    if bucket % 60 == 0:
        return f"{bucket / 60:g} minutes"
    return f"{bucket:g} s"


def clock(epoch: float) -> str:
    """``HH:MM`` in UTC."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%H:%M")


def describe(buckets: Sequence[ActivityBucket], *, bucket: float) -> str:
    """The chart in one sentence (its ``<desc>``)."""
    if not buckets:
        return "No activity to show."
    t = totals(buckets)
    start, end = buckets[0].start, buckets[-1].start + bucket
    text = (
        f"From {clock(start)} to {clock(end)} UTC, per {per(bucket)}: "
        f"{t.sent} sent, {t.failed} failed, {t.in_doubt} in doubt."
    )
    if t.peak_at is None:
        return text + " Nothing happened."
    return text + f" The busiest {per(bucket)}, {clock(t.peak_at)} UTC, had {t.peak}."


def _nice(n: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50… that is at least ``n`` (and at least 1)."""
    if n <= 1:
        return 1
    power = int("1" + "0" * (len(str(n)) - 1))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= n)


def _tick(span: float) -> int:
    for step in TICKS:
        if span / step <= 8:
            return step
    return TICKS[-1]


def _f(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def svg(
    buckets: Sequence[ActivityBucket],
    *,
    bucket: float,
    title: str,
    element_id: str = "activity-chart",
) -> str:
    """The stacked bar chart of ``buckets`` (oldest first, each ``bucket`` seconds)."""
    ident = escape(element_id, quote=True)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{ident}" class="chart" role="img" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" aria-labelledby="{ident}-title {ident}-desc">',
        f'<title id="{ident}-title">{escape(title)}</title>',
        f'<desc id="{ident}-desc">{escape(describe(buckets, bucket=bucket))}</desc>',
    ]
    x = LEFT
    for _, label, colour in SERIES:  # the legend, top left
        out.append(f'<rect x="{x}" y="8" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{x + 14}" y="17" font-size="11">{escape(label)}</text>')
        x += 14 + 7 * len(label) + 16
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    base = TOP + plot_h
    top = _nice(totals(buckets).peak)
    for value in (0, top // 2, top) if top % 2 == 0 else (0, top):  # grid, y labels
        y = base - plot_h * value / top
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{_f(y)}" y2="{_f(y)}" '
            'stroke="#dde3e8" stroke-width="1"/>'
        )
        out.append(
            f'<text x="{LEFT - 6}" y="{_f(y + 4)}" font-size="11" text-anchor="end">{value}</text>'
        )
    if not buckets:
        out.append(
            f'<text x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" font-size="12" '
            'text-anchor="middle">no activity</text></svg>'
        )
        return "".join(out)
    start, span = buckets[0].start, bucket * len(buckets)
    width = plot_w / len(buckets)
    for i, b in enumerate(buckets):
        if b.sent + b.failed + b.in_doubt == 0:
            continue
        counts = ", ".join(f"{getattr(b, field)} {label}" for field, label, _ in SERIES)
        out.append(f'<g class="bar"><title>{clock(b.start)} UTC: {escape(counts)}</title>')
        y = float(base)
        for field, _, colour in SERIES:
            n = getattr(b, field)
            if n == 0:
                continue
            h = plot_h * n / top
            y -= h
            out.append(
                f'<rect class="{field}" x="{_f(LEFT + i * width)}" y="{_f(y)}" '
                f'width="{_f(max(width - 0.5, 0.5))}" height="{_f(h)}" fill="{colour}"/>'
            )
        out.append("</g>")
    step = _tick(span)
    first = math.ceil(start / step) * step
    for at in range(int(first), int(start + span) + 1, step):  # the time axis
        x_at = LEFT + plot_w * (at - start) / span
        out.append(
            f'<line x1="{_f(x_at)}" x2="{_f(x_at)}" y1="{base}" y2="{base + 4}" '
            'stroke="#5f6b76" stroke-width="1"/>'
        )
        out.append(
            f'<text x="{_f(x_at)}" y="{base + 16}" font-size="11" text-anchor="middle">'
            f"{clock(at)}</text>"
        )
    out.append(
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{base}" y2="{base}" '
        'stroke="#5f6b76" stroke-width="1"/></svg>'
    )
    return "".join(out)
