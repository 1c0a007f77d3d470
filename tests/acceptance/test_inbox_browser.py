"""``<kirim-inbox>`` in a real browser: headless Chromium (Debian's) driven by
Playwright, as the dashboard's tests do.

kirim serves the element (``/static/kirim-inbox.js``) and the feed on 127.0.0.1 (uvicorn
in a thread, a SQLite file); the page that embeds it comes from another origin (a
second server on another port), so the element works through the feed's CORS, with a
feed token, as on an application's page. Messages are written by the library's worker
on its own connection, as another process's would be: the served app hears of them by
its counter's poll. Screenshots go to test-artifacts/ (``inbox-*.png``). Without
/usr/bin/chromium the tests fail in CI (CI set) and are skipped, loudly, elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fastapi import FastAPI
from starlette.responses import HTMLResponse
from test_dashboard import ARGS, ARTIFACTS, CHROMIUM, _chromium

from http_kit import free_port, served
from kirim.channels import Channel
from kirim.config import Config, InboxSettings
from kirim.engine import Kirim
from kirim.http import create_app
from kirim.providers.inbox import InboxProvider
from kirim.worker import WorkerSettings

pytestmark = pytest.mark.slow
T = TypeVar("T")
SECRET = "s3cret-for-the-browser-tests-0123456789"
RID = "1007"
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Shop</title>
<style>
  body {{ font-family: system-ui, sans-serif; margin: 0; background: #f5f6f8; }}
  nav {{ display: flex; justify-content: space-between; align-items: center; padding: 12px 24px;
        background: #fff; border-bottom: 1px solid #e3e6eb; }}
  kirim-inbox {{ --kirim-inbox-accent: #0f766e; }}
</style>
<script type="module" src="{kirim}/static/kirim-inbox.js"></script></head>
<body><nav><strong>shop.example</strong>
<kirim-inbox server="{kirim}" recipient="{rid}" token="{token}"></kirim-inbox></nav>
<main style="padding: 24px">Your orders</main></body></html>
"""


def _kirim(database: str, origin: str) -> Kirim:
    config = Config(
        database=database, inbox=InboxSettings(secret=SECRET, allowed_origins=(origin,))
    )
    return Kirim(config, channels={"inbox": Channel(name="inbox", provider=InboxProvider())})


def in_thread(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``work`` in a loop of its own thread (Playwright's sync API holds this one)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(work())).result()


def deliver(database: str, *titles: str) -> None:
    """Notify the recipient once per title and let a worker write them into the feed
    (the library, on its own connection: another process)."""

    async def go() -> None:
        app = _kirim(database, "http://unused")
        await app.open(migrate=True)
        try:
            for title in titles:
                await app.notify(
                    f"order-{title}",
                    RID,
                    "inbox",
                    {"title": title, "body": "It should arrive on Friday."},
                )
            worker = app.worker(settings=WorkerSettings(lease=30.0))
            while await worker.run_once():
                pass
        finally:
            await app.close()

    in_thread(go)


def counts(database: str) -> dict[str, int]:
    async def go() -> dict[str, int]:
        app = _kirim(database, "http://unused")
        await app.open()
        try:
            return (await app.feed_counts(RID)).to_json()
        finally:
            await app.close()

    return in_thread(go)


@contextlib.contextmanager
def setup(tmp_path: Path) -> Iterator[tuple[str, str, int, str]]:
    """(database, the page's URL, kirim's port, the page's origin): kirim is served by
    the caller (it restarts it); the page is served here."""
    database = f"sqlite:///{tmp_path / 'kirim.db'}"
    deliver(database)  # the schema
    page_port, kirim_port = free_port(), free_port()
    origin = f"http://127.0.0.1:{page_port}"
    token = _kirim(database, origin).feed_token(RID, ttl=3600)[0]
    html = PAGE.format(kirim=f"http://127.0.0.1:{kirim_port}", rid=RID, token=token)
    shop = FastAPI()

    @shop.get("/")
    async def home() -> HTMLResponse:
        return HTMLResponse(html)

    with served(shop, port=page_port) as page_url:
        yield database, page_url + "/", kirim_port, origin


def test_a_message_appears_live_and_opening_the_bell_marks_it_seen(tmp_path: Path) -> None:
    """A message a worker writes appears on the open page without a reload, with the
    badge; opening the bell (by keyboard) marks it seen, in the feed too."""
    _chromium()
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with setup(tmp_path) as (database, page_url, port, origin):
        app = create_app(_kirim(database, origin))
        with served(app, port=port), sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 900, "height": 600})
                page.goto(page_url)
                inbox = page.locator("kirim-inbox")
                expect(inbox).to_have_attribute("data-unseen", "0")
                expect(page.locator("kirim-inbox .empty")).to_be_attached()
                deliver(database, "Your order 48291 has shipped")
                badge = page.locator("kirim-inbox .badge")
                expect(badge).to_have_text("1")
                expect(page.locator("kirim-inbox .status")).to_contain_text("48291")
                bell = page.get_by_role("button", name="Notifications, 1 unseen, 1 unread")
                bell.focus()  # the name changes with the counts: by its class from here
                bell = page.locator("kirim-inbox .bell")
                page.keyboard.press("Enter")
                expect(bell).to_have_attribute("aria-expanded", "true")
                expect(page.locator("kirim-inbox li")).to_contain_text("has shipped")
                expect(inbox).to_have_attribute("data-unseen", "0")
                expect(badge).to_be_hidden()
                deliver(database, "Your order 48292 has shipped")
                expect(page.locator("kirim-inbox li")).to_have_count(2)
                page.screenshot(path=str(ARTIFACTS / "inbox.png"))
                page.keyboard.press("Escape")
                expect(bell).to_have_attribute("aria-expanded", "false")
            finally:
                browser.close()
        assert counts(database) == {"unseen": 1, "unread": 2}
    assert (ARTIFACTS / "inbox.png").stat().st_size > 5_000


def test_mark_all_read_updates_a_second_tab(tmp_path: Path) -> None:
    """ "Mark all read" in one tab turns every message read in another tab too."""
    _chromium()
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with setup(tmp_path) as (database, page_url, port, origin):
        deliver(database, "first", "second")
        with served(create_app(_kirim(database, origin)), port=port), sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            try:
                context = browser.new_context(viewport={"width": 900, "height": 600})
                one, two = context.new_page(), context.new_page()
                for tab in (one, two):
                    tab.goto(page_url)
                    expect(tab.locator("kirim-inbox li.unread")).to_have_count(2)
                one.locator("kirim-inbox .bell").click()
                one.get_by_role("button", name="Mark all read").click()
                expect(two.locator("kirim-inbox")).to_have_attribute("data-unread", "0")
                expect(two.locator("kirim-inbox li.read")).to_have_count(2)
                two.locator("kirim-inbox .bell").click()
                two.screenshot(path=str(ARTIFACTS / "inbox-second-tab.png"))
                two.get_by_role("button", name="Archive: first").click()
                expect(one.locator("kirim-inbox li")).to_have_count(1)
            finally:
                browser.close()


def test_a_reconnect_after_a_server_restart_misses_nothing(tmp_path: Path) -> None:
    """Messages written while kirim is down appear once it is back, without a reload,
    each once, and the badge counts them all."""
    _chromium()
    from playwright.sync_api import expect, sync_playwright

    with setup(tmp_path) as (database, page_url, port, origin), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 600})
            with served(create_app(_kirim(database, origin)), port=port):
                deliver(database, "before")
                page.goto(page_url)
                expect(page.locator("kirim-inbox li")).to_have_count(1)
            deliver(database, "while down 1", "while down 2")  # kirim is stopped
            with served(create_app(_kirim(database, origin)), port=port):
                items = page.locator("kirim-inbox li")
                expect(items).to_have_count(3, timeout=20_000)
                expect(page.locator("kirim-inbox .badge")).to_have_text("3")
                titles = [
                    t.strip() for t in page.locator("kirim-inbox li .title").all_inner_texts()
                ]
                assert [t.strip() for t in titles] == ["while down 2", "while down 1", "before"]
        finally:
            browser.close()
