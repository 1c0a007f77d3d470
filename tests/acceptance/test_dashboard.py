"""The dashboard in a real browser: headless Chromium (Debian's) driven by Playwright.

The service runs on 127.0.0.1 (uvicorn in a thread) on a SQLite file holding a
delivered, a pending and a dead-lettered notification. The test finds the dead one
by its key, reads its timeline, retries it with the button and checks that the
screen changed; a screenshot goes to test-artifacts/. Without /usr/bin/chromium the
test fails in CI (CI set) and is skipped, loudly, elsewhere (`make test` installs it).
"""

from __future__ import annotations

import asyncio
import os
import re
from datetime import timedelta
from pathlib import Path

import pytest

from http_kit import served
from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.http import create_app
from kirim.testing import FlakyProvider
from kirim.worker import WorkerSettings

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
DEAD_KEY = "order-42-push"

pytestmark = pytest.mark.slow


def _chromium() -> None:
    if CHROMIUM.exists():
        return
    why = f"{CHROMIUM} not found: install it with `apt-get install -y chromium` (make test does)"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(f"SKIPPED LOUDLY: the browser test did not run: {why}")


def _app(database: str, provider: FlakyProvider) -> Kirim:
    push = Channel(name="push", provider=provider)
    return Kirim(Config(database=database, max_attempts=3), channels={"push": push})


def _prepare(database: str) -> dict[str, int]:
    """One sent, one pending (scheduled later), one dead-lettered (refused for good)."""

    async def go() -> dict[str, int]:
        kirim = _app(database, FlakyProvider(script=["ok", "permanent"]))
        await kirim.open(migrate=True)
        try:
            sent = await kirim.notify("order-41", "1007", "push", {"title": "Shipped"})
            dead = await kirim.notify(
                "order-42", "1007", "push", {"title": "Delayed"}, key=DEAD_KEY
            )
            worker = kirim.worker(settings=WorkerSettings(lease=10), worker_id="worker-A")
            await worker.run_once()
            later = await kirim.notify(
                "order-43", "1008", "push", {"title": "Soon"}, send_after=timedelta(hours=1)
            )
            return {"sent": sent.delivery_id, "dead": dead.delivery_id, "later": later.delivery_id}
        finally:
            await kirim.close()

    return asyncio.run(go())


def test_find_a_notification_by_key_and_retry_it(tmp_path: Path) -> None:
    _chromium()
    from playwright.sync_api import expect, sync_playwright

    database = f"sqlite:///{tmp_path / 'kirim.db'}"
    ids = _prepare(database)
    ARTIFACTS.mkdir(exist_ok=True)
    with served(create_app(_app(database, FlakyProvider()))) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(base + "/")
            expect(page.locator("#count-total")).to_have_text("3")
            expect(page.locator("#count-failed")).to_have_text("1")
            expect(page.locator("#count-sent")).to_have_text("1")
            dead_row = page.locator(f'#dead-letters tr[data-id="{ids["dead"]}"]')
            expect(dead_row).to_contain_text("order-42")
            expect(dead_row).to_contain_text("dead")

            # find it by its key
            page.fill("input[name=q]", DEAD_KEY)
            page.keyboard.press("Enter")
            page.wait_for_url(re.compile(r"\?q=order-42-push"))
            found = page.locator(f'#results tr[data-id="{ids["dead"]}"]')
            expect(found).to_contain_text("failed")
            found.locator(f'a[href="/dashboard/notifications/{ids["dead"]}"]').click()

            # its timeline, drawn as a pseudo-log
            expect(page.locator("h1")).to_contain_text(f"Notification {ids['dead']}")
            expect(page.locator("#status")).to_have_text("failed")
            timeline = page.locator("#timeline")
            expect(timeline).to_contain_text("worker=worker-A")
            expect(timeline).to_contain_text("attempt=1 action=provider_request request_id=req-")
            expect(timeline).to_contain_text("result=failed_permanent")
            expect(page.locator("#key")).to_have_text(DEAD_KEY)
            page.screenshot(path=str(ARTIFACTS / "dashboard-before-retry.png"), full_page=True)

            # retry it: the screen changes
            page.get_by_role("button", name="Retry").click()
            expect(page.locator("#flash")).to_have_text(
                f"notification {ids['dead']} requeued with a fresh job"
            )
            expect(page.locator("#status")).to_have_text("pending")
            expect(page.locator("#job")).to_contain_text("queued")
            expect(page.get_by_role("button", name="Retry")).to_have_count(0)
            page.screenshot(path=str(ARTIFACTS / "dashboard-after-retry.png"), full_page=True)

            page.goto(base + "/")
            expect(page.locator("#count-failed")).to_have_text("0")
            expect(page.locator("#count-pending")).to_have_text("2")
            expect(page.locator("#dead-total")).to_have_text("0")
            expect(page.locator("#queue-depth")).to_have_text("1")  # the retried one
            expect(page.get_by_text("no dead letters")).to_be_visible()
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        finally:
            browser.close()
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000
