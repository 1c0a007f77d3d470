"""The dashboard's figures agree with each other on a seeded database (both backends):
the cards, the chart's totals, the tables and the per-channel breakdown count the same
deliveries by the same definitions; labels are words, times relative; bulk retry and
cancel ask first, saying when a second copy is possible.

The seed (``seeded``): on push (not idempotent, assume_sent) two sent, one assumed
sent, one refused for good (a dead letter), one due later, one canceled; on email
(not idempotent, hold) one sent and one held in doubt.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta
from html import unescape

import pytest

from http_kit import Api, api_on
from kirim.channels import Channel
from kirim.config import Config, ServeSettings
from kirim.engine import Kirim
from kirim.model import DeliveryStatus, OnUnknown
from kirim.testing import FlakyProvider, ManualClock
from kirim.timeline import events
from kirim.worker import WorkerSettings

ANON = {"Authorization": ""}
SAME_ORIGIN = {"Origin": "http://testserver", **ANON}
LOCAL = ServeSettings(allowed_hosts=("testserver",))


@pytest.fixture
async def seeded(database_url: str) -> AsyncIterator[tuple[Api, dict[str, int]]]:
    clock = ManualClock()
    push = Channel(
        name="push",
        provider=FlakyProvider(script=["ok", "ok", "ambiguous", "permanent"], idempotent=False),
        on_unknown=OnUnknown.ASSUME_SENT,
    )
    email = Channel(
        name="email",
        provider=FlakyProvider(script=["ambiguous", "ok"], idempotent=False),
        on_unknown=OnUnknown.HOLD,
    )
    app = Kirim(
        Config(database=database_url, max_attempts=3),
        channels={"push": push, "email": email},
        clock=clock,
    )
    await app.open(migrate=True)
    ids = {}
    for name in ("sent-1", "sent-2", "assumed", "dead"):
        ids[name] = (await app.notify(name, "1007", "push", {"t": name})).delivery_id
    for name in ("held", "sent-3"):
        ids[name] = (await app.notify(name, "1007", "email", {"t": name})).delivery_id
    later = await app.notify("later", "1007", "push", {}, send_after=timedelta(hours=2))
    ids["later"] = later.delivery_id
    ids["gone"] = (await app.notify("gone", "1008", "push", {})).delivery_id
    await app.cancel(ids["gone"], by="id")
    worker = app.worker(settings=WorkerSettings(lease=10), worker_id="A")
    for _ in range(3):
        await worker.run_once()
        clock.advance(600)
    try:
        async with api_on(app, settings=LOCAL) as api:
            yield api, ids
    finally:
        await app.close()


def number(html: str, ident: str) -> int:
    found = re.search(rf'id="{re.escape(ident)}"[^>]*>([0-9,]+)<', html)
    assert found, ident
    return int(found.group(1).replace(",", ""))


def rows(html: str, table: str) -> list[int]:
    """The delivery ids of a table's rows."""
    found = re.search(rf'<table id="{table}".*?</table>', html, re.S)
    return [] if found is None else [int(i) for i in re.findall(r'data-id="(\d+)"', found.group(0))]


def visible(html: str) -> str:
    """The page's text as a reader sees it: no tags, attributes, timelines or styles."""
    html = re.sub(r"<(pre|style|script)\b.*?</\1>", " ", html, flags=re.S)
    return unescape(re.sub(r"<[^>]+>", " ", html))


async def test_dashboard_is_the_overview_not_a_404(seeded: tuple[Api, dict[str, int]]) -> None:
    """/dashboard and /dashboard/ lead to the overview (they were a JSON 404)."""
    api, _ = seeded
    for path in ("/dashboard", "/dashboard/"):
        got = await api.client.get(path, headers=ANON)
        assert got.status_code == 303, (path, got.text)
        assert got.headers["location"] == "/"


async def test_cards_chart_tables_and_channels_agree(seeded: tuple[Api, dict[str, int]]) -> None:
    """Every figure of the overview comes out of one definition: the cards, the chart's
    totals, the rows of its tables and the per-channel table count the same
    deliveries (an assumed-sent one is in doubt everywhere, never sent)."""
    api, ids = seeded
    html = (await api.client.get("/", params={"hours": "3"}, headers=ANON)).text
    cards = {
        k: number(html, f"count-{k}")
        for k in ("pending", "sent", "assumed_sent", "in_doubt", "failed", "canceled")
    }
    assert cards == {
        "pending": 1, "sent": 3, "assumed_sent": 1, "in_doubt": 1, "failed": 1, "canceled": 1,
    }  # fmt: skip
    assert number(html, "count-total") == 8
    in_doubt = number(html, "in-doubt-total")
    assert in_doubt == cards["assumed_sent"] + cards["in_doubt"] == 2
    assert number(html, "activity-sent") == cards["sent"] + number(html, "count-delivered")
    assert number(html, "activity-in-doubt") == in_doubt
    assert number(html, "activity-failed") == cards["failed"] + number(html, "count-bounced")
    assert rows(html, "held-in-doubt") == [ids["held"]]
    assert rows(html, "assumed-sent") == [ids["assumed"]]
    assert rows(html, "dead-letters") == [ids["dead"]]
    assert number(html, "dead-total") == 1
    for figure, total in cards.items():
        per_channel = [
            int(n)
            for n in re.findall(rf'<td data-channel="\w+" data-figure="{figure}"[^>]*>(\d+)<', html)
        ]
        assert sum(per_channel) == total, figure
    assert number(html, "channel-push-sent") == 2
    assert number(html, "channel-email-sent") == 1
    assert number(html, "channel-email-in_doubt") == 1


async def test_labels_are_words_and_times_are_relative(
    seeded: tuple[Api, dict[str, int]],
) -> None:
    """No raw status name (in_doubt, assumed_sent, retry_scheduled) reaches the reader;
    a row's time says how long ago, with the exact time kept in its datetime."""
    api, _ = seeded
    for path in ("/", "/dashboard/attention", "/dashboard/browse"):
        text = visible((await api.client.get(path, headers=ANON)).text)
        for raw in ("in_doubt", "assumed_sent", "retry_scheduled", "failed_permanent"):
            assert raw not in text, (path, raw)
    html = (await api.client.get("/", headers=ANON)).text
    assert "held in doubt" in html
    assert "assumed sent" in html
    stamps = re.findall(r'<time datetime="([^"]+)"[^>]*>([^<]+)</time>', html)
    assert stamps
    assert all(when.endswith("Z") and "ago" in shown for when, shown in stamps), stamps


async def test_a_plain_refusal_is_not_shown_as_a_race(seeded: tuple[Api, dict[str, int]]) -> None:
    """A dead letter the provider refused for good (a 404) has no highlighted line: it
    is no sign of a race; the held one's unknown answer is."""
    api, ids = seeded
    dead = await api.kirim.get(ids["dead"], by="id")
    held = await api.kirim.get(ids["held"], by="id")
    assert dead is not None
    assert held is not None
    now = api.kirim.clock.now()
    assert [e.action for e in events(dead, now=now) if e.warn] == []
    assert any(e.warn for e in events(held, now=now))
    html = (await api.client.get("/dashboard/attention", headers=ANON)).text
    dead_section = html.split('id="attention-dead"')[1].split('id="attention-held"')[0]
    assert "line warn" not in dead_section


async def test_bulk_retry_asks_first_and_says_when_a_second_copy_is_possible(
    seeded: tuple[Api, dict[str, int]],
) -> None:
    """Selected rows and a verb lead to a confirmation that says, per notification,
    whether a retry may make a second copy (an earlier request may have reached a
    provider that honours no key) or cannot (every request was refused); confirming
    retries them all and says how many."""
    api, ids = seeded
    form = {"action": "retry", "id": [str(ids["held"]), str(ids["dead"])], "back": "/"}
    ask = await api.client.post("/dashboard/bulk", data=form, headers=SAME_ORIGIN)
    assert ask.status_code == 200, ask.text
    page = ask.text
    assert "Retry 2 notifications?" in page
    held = page.split(f'data-id="{ids["held"]}"')[1].split("</tr>")[0]
    dead = page.split(f'data-id="{ids["dead"]}"')[1].split("</tr>")[0]
    assert "may arrive twice" in held
    assert "no second copy" in dead
    assert "1 of them may arrive twice" in page
    assert (await api.kirim.get(ids["dead"], by="id")).job.status.value == "dead"  # type: ignore[index,union-attr]
    done = await api.client.post(
        "/dashboard/bulk", data={**form, "confirm": "1"}, headers=SAME_ORIGIN
    )
    assert done.status_code == 303, done.text
    back = await api.client.get(done.headers["location"], headers=ANON)
    assert "retry: 2 done" in back.text
    for name in ("held", "dead"):
        record = await api.kirim.get(ids[name], by="id")
        assert record is not None
        assert record.delivery.status is DeliveryStatus.PENDING, name


async def test_bulk_cancel_and_a_refused_one_are_counted(
    seeded: tuple[Api, dict[str, int]],
) -> None:
    """Cancel of a waiting notification and of a sent one (refused): one done, one
    refused, each said; nothing happens without the confirmation."""
    api, ids = seeded
    form = {"action": "cancel", "id": [str(ids["later"]), str(ids["sent-1"])], "back": "/"}
    ask = await api.client.post("/dashboard/bulk", data=form, headers=SAME_ORIGIN)
    assert "Cancel 2 notifications?" in ask.text
    assert "nothing more is sent" in ask.text
    done = await api.client.post(
        "/dashboard/bulk", data={**form, "confirm": "1"}, headers=SAME_ORIGIN
    )
    back = await api.client.get(done.headers["location"], headers=ANON)
    assert "cancel: 1 done, 1 refused" in back.text
    later = await api.kirim.get(ids["later"], by="id")
    assert later is not None
    assert later.delivery.status is DeliveryStatus.CANCELED
    unknown = await api.client.post(
        "/dashboard/bulk", data={**form, "action": "explode"}, headers=SAME_ORIGIN
    )
    assert unknown.status_code == 422
