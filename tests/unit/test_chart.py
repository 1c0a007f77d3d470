"""The overview's activity chart: buckets in, an SVG string out."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from kirim.http import chart
from kirim.store.base import ActivityBucket

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
NS = {"svg": "http://www.w3.org/2000/svg"}


def b(i: int, sent: int = 0, failed: int = 0, in_doubt: int = 0) -> ActivityBucket:
    return ActivityBucket(start=T0 + 60 * i, sent=sent, failed=failed, in_doubt=in_doubt)


def three_hours() -> list[ActivityBucket]:
    found = [b(i) for i in range(180)]
    found[5] = b(5, sent=4, failed=1)
    found[90] = b(90, sent=2, in_doubt=3)
    found[179] = b(179, failed=2)
    return found


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def child(root: ET.Element, tag: str) -> ET.Element:
    found = root.find(f"svg:{tag}", NS)
    assert found is not None, tag
    return found


def test_the_svg_is_well_formed_and_labelled_by_its_title_and_desc() -> None:
    """One <svg role=img> whose aria-labelledby names its own <title> and <desc>."""
    root = parse(chart.svg(three_hours(), bucket=60, title="Deliveries per minute"))
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.get("role") == "img"
    title, desc = child(root, "title"), child(root, "desc")
    assert root.get("aria-labelledby") == f"{title.get('id')} {desc.get('id')}"
    assert title.text == "Deliveries per minute"


def test_the_text_alternative_says_the_totals_and_the_busiest_bucket() -> None:
    """The <desc> sums each series and names the busiest minute (the first of equals)."""
    text = chart.describe(three_hours(), bucket=60)
    assert text == (
        "From 08:00 to 11:00 UTC, per minute: 6 sent, 3 failed, 3 in doubt. "
        "The busiest minute, 08:05 UTC, had 5."
    )
    assert child(parse(chart.svg(three_hours(), bucket=60, title="t")), "desc").text == text
    quiet = chart.describe([b(0), b(1)], bucket=60)
    assert (
        quiet
        == "From 08:00 to 08:02 UTC, per minute: 0 sent, 0 failed, 0 in doubt. Nothing happened."
    )
    assert chart.describe([], bucket=60) == "No activity to show."


def test_one_stacked_bar_per_busy_bucket_with_heights_in_proportion() -> None:
    """Only buckets with something in them get a bar; each series is a rect whose height
    is its share of the scale (the busiest bucket, 5, rounded up to a nice 5)."""
    root = parse(chart.svg(three_hours(), bucket=60, title="t"))
    bars = root.findall("svg:g[@class='bar']", NS)
    assert len(bars) == 3
    tips = [child(g, "title").text for g in bars]
    assert tips == [
        "08:05 UTC: 4 sent, 1 failed, 0 in doubt",
        "09:30 UTC: 2 sent, 0 failed, 3 in doubt",
        "10:59 UTC: 0 sent, 2 failed, 0 in doubt",
    ]
    plot = chart.HEIGHT - chart.TOP - chart.BOTTOM
    rects = {r.get("class"): float(r.get("height", "0")) for r in bars[0].findall("svg:rect", NS)}
    assert rects == {"sent": plot * 4 / 5, "failed": plot * 1 / 5}
    first, last = (float(child(g, "rect").get("x", "0")) for g in (bars[0], bars[2]))
    assert first < last <= chart.WIDTH - chart.RIGHT


def test_the_time_axis_is_labelled_in_utc_at_round_times() -> None:
    """Three hours get a label every 30 minutes, from 08:00 to 11:00."""
    svg = chart.svg(three_hours(), bucket=60, title="t")
    labels = re.findall(r'text-anchor="middle">(\d\d:\d\d)</text>', svg)
    assert labels == ["08:00", "08:30", "09:00", "09:30", "10:00", "10:30", "11:00"]


def test_every_text_is_escaped() -> None:
    """A title and an element id with markup in them stay text."""
    svg = chart.svg([b(0, sent=1)], bucket=60, title='<script>"x"</script>', element_id='a"b<')
    assert "<script>" not in svg
    root = parse(svg)
    assert child(root, "title").text == '<script>"x"</script>'
    assert root.get("id") == 'a"b<'


def test_no_buckets_draw_an_empty_chart() -> None:
    """No buckets: an SVG that says so, still well formed, without bars."""
    root = parse(chart.svg([], bucket=60, title="t"))
    assert root.findall("svg:g[@class='bar']", NS) == []
    assert "no activity" in "".join(root.itertext())


def test_bucket_widths_in_words() -> None:
    """minute, hour, 5 minutes, 2 hours, 90 s."""
    assert [chart.per(s) for s in (60, 3600, 300, 7200, 90)] == [
        "minute",
        "hour",
        "5 minutes",
        "2 hours",
        "90 s",
    ]
