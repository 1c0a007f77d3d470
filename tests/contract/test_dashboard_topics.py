"""The dashboard's topics pages on both backends: the counts of ``kirim status``, the
topics with their subscriber counts, the latest topic events with their fan-out's
progress, one topic's page, everything the user named escaped."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from html import unescape

import pytest

from http_kit import api_on
from kirim.channels import Channel
from kirim.config import Config, ServeSettings
from kirim.engine import Kirim
from kirim.http.dashboard_topics import topic_href
from kirim.notify import parse_type
from kirim.testing import FlakyProvider, ManualClock

NEWS = parse_type("news", {"templates": {"push": {"title": "{{ title }}"}}})
ANON = {"Authorization": ""}
HOSTILE = '<b id="x">p&q</b>/?#'
LEASE = 30.0


@pytest.fixture
async def app(database_url: str, clock: ManualClock) -> AsyncIterator[Kirim]:
    channels = {"push": Channel(name="push", provider=FlakyProvider())}
    found = Kirim(Config(database=database_url), channels=channels, clock=clock, types=[NEWS])
    await found.open(migrate=True)
    try:
        yield found
    finally:
        await found.close()


async def _batch(app: Kirim, recipients: list[str], *, last: bool) -> None:
    """One batch of the oldest topic event still expanding, for ``recipients``."""
    now = app.clock.now()
    event = await app.store.claim_topic_event(worker_id="w", now=now, lease=LEASE)
    assert event is not None
    assert event.lease_token is not None
    items = await app.plan_topic_batch(event, recipients)
    args = {"last": last, "now": now, "lease": LEASE}
    await app.store.expand_topic_batch(event, event.lease_token, recipients, items, **args)


async def _seeded(app: Kirim) -> None:
    """Topic ``news`` with two subscribers and three events: one done, one expanding
    (one batch of two), one pending; a hostile topic with one subscriber."""
    for who in ("u-1", "u-2"):
        await app.subscribe("news", who)
    await app.subscribe(HOSTILE, "u-1")
    await app.unsubscribe(HOSTILE, "u-1")
    await app.subscribe(HOSTILE, "u-3")
    for event_id in ("e-1", "e-2", "e-3"):
        await app.notify_topic("news", "news", {"title": "hi"}, event_id=event_id)
    await _batch(app, ["u-1", "u-2"], last=True)  # e-1 done
    await _batch(app, ["u-1"], last=False)  # e-2 expanding
    # e-3 pending; the hostile topic's own event is pending too
    await app.notify_topic("news", HOSTILE, {"title": "<i>"}, event_id='<e id="4">')


async def test_the_topics_page_counts_lists_and_shows_progress(app: Kirim) -> None:
    """/dashboard/topics: the counts, each topic with its subscribers, the latest
    topic events with pending, expanding and done; linked from the nav."""
    await _seeded(app)
    async with api_on(app, settings=ServeSettings(allowed_hosts=("testserver",))) as api:
        page = await api.client.get("/dashboard/topics", headers=ANON)
        assert page.status_code == 200, page.text
        html = page.text
        cards = dict(re.findall(r'id="count-(\w+)">(\d+)<', html))
        assert cards == {
            "topics": "2",
            "subscriptions": "3",
            "pending": "2",
            "expanding": "1",
            "done": "1",
        }
        rows = re.findall(r'<tr class="topic"><td class="wrap"><a href="([^"]+)">(.*?)</a></td>'
                          r'<td data-subscribers="(\d+)">', html)  # fmt: skip
        assert [(unescape(name), n) for _, name, n in rows] == [(HOSTILE, "1"), ("news", "2")]
        progress = re.findall(r'class="fanout" data-progress="(\w+)" data-id="(\d+)"', html)
        assert [p for p, _ in progress] == ["pending", "pending", "expanding", "done"]
        assert (
            'href="/dashboard/topics">topics</a>' in (await api.client.get("/", headers=ANON)).text
        )


async def test_everything_named_is_escaped(app: Kirim) -> None:
    """A topic, type or event id with markup in it is shown as text, never as markup,
    and its link leads to its page."""
    await _seeded(app)
    async with api_on(app, settings=ServeSettings(allowed_hosts=("testserver",))) as api:
        html = (await api.client.get("/dashboard/topics", headers=ANON)).text
        assert '<b id="x">' not in html
        assert '<e id="4">' not in html
        assert "&lt;b id=&#34;x&#34;&gt;p&amp;q&lt;/b&gt;/?#" in html
        assert "&lt;e id=&#34;4&#34;&gt;" in html
        href = topic_href(HOSTILE)
        assert f'href="{href}"' in html
        one = await api.client.get(href, headers=ANON)
        assert one.status_code == 200, one.text
        assert '<b id="x">' not in one.text
        assert re.search(r'id="subscribers">1<', one.text)
        assert re.findall(r'data-progress="(\w+)"', one.text) == ["pending"]


async def test_one_topics_page_and_a_missing_one(app: Kirim) -> None:
    """/dashboard/topics/T: its subscribers and its latest fan-outs, newest first;
    a topic nobody subscribed or sent to is a 404 page."""
    await _seeded(app)
    async with api_on(app, settings=ServeSettings(allowed_hosts=("testserver",))) as api:
        page = await api.client.get("/dashboard/topics/news", headers=ANON)
        assert page.status_code == 200, page.text
        assert re.search(r'id="subscribers">2<', page.text)
        progress = re.findall(r'data-progress="(\w+)" data-id="\d+"', page.text)
        assert progress == ["pending", "expanding", "done"]
        missing = await api.client.get("/dashboard/topics/nobody", headers=ANON)
        assert missing.status_code == 404
        assert "No topic" in missing.text
        bad = await api.client.get("/dashboard/topics/%20", headers=ANON)
        assert bad.status_code == 404


async def test_the_topics_pages_need_a_login_when_protected(app: Kirim) -> None:
    """A protected dashboard sends a visitor without a token to the login form."""
    await _seeded(app)
    async with api_on(app, settings=ServeSettings(protect_dashboard=True)) as api:
        for path in ("/dashboard/topics", "/dashboard/topics/news"):
            page = await api.client.get(path, headers=ANON)
            assert page.status_code == 303
            assert page.headers["location"].startswith("/dashboard/login?next=")
            assert (await api.client.get(path)).status_code == 200  # the bearer token


async def test_the_topics_page_refuses_a_host_it_does_not_answer(app: Kirim) -> None:
    """An unprotected dashboard answers only the names of ``allowed_hosts``."""
    async with api_on(app, settings=ServeSettings(allowed_hosts=("kirim.internal",))) as api:
        assert (await api.client.get("/dashboard/topics", headers=ANON)).status_code == 403
