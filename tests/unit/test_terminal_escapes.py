"""Terminal escape injection: an event id recorded before it was refused, or a
provider's error body, holding escape sequences (set the window's title, clear the
screen, print a fake "sent") reaches no terminal raw through ``kirim status``, ``list``,
``dead-letter list`` or the dashboard; they show it escaped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from click.testing import CliRunner

from kirim.channels import Channel
from kirim.cli import main
from kirim.config import Config
from kirim.engine import Kirim
from kirim.errors import PermanentFailure
from kirim.http import create_app
from kirim.keys import canonical_json, payload_hash
from kirim.providers.base import Message, Sent
from kirim.store.base import NewDelivery

TITLE = "\x1b]0;owned\x07"
CLEAR = "\x1b[2J\x1b[H"
FAKE = "\rdelivery 1 sent\x1b[K"


class Refusing:
    """A provider whose refusal carries escape sequences in its words."""

    idempotent = False

    async def send(self, message: Message) -> Sent:
        raise PermanentFailure(f"HTTP 400: {TITLE}{CLEAR}{FAKE}")


async def recorded(url: str) -> None:
    kirim = Kirim(
        Config(database=url), channels={"push": Channel(name="push", provider=Refusing())}
    )
    await kirim.open(migrate=True)
    try:
        text = canonical_json({"t": 1})
        old = NewDelivery(  # as a release that took any text recorded it
            idempotency_key="k-old",
            event_id=f"order{TITLE}{CLEAR}",
            recipient=f"bob{FAKE}",
            channel="push",
            payload_json=text,
            payload_hash=payload_hash(text),
            run_at=None,
            max_attempts=1,
        )
        await kirim.store.enqueue([old], now=kirim.clock.now())
        await kirim.worker(worker_id=f"w{TITLE}").run_once()
    finally:
        await kirim.close()


def test_no_terminal_escape_reaches_the_cli_or_the_dashboard(tmp_path: Path) -> None:
    """status (text and JSON), list and dead-letter list print the values escaped
    (\\x1b]0;owned\\x07), and the dashboard's page of the delivery too."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    asyncio.run(recorded(url))
    runner = CliRunner()
    outputs = {}
    for args in (["status", "1"], ["status", "1", "--json"], ["list"], ["dead-letter", "list"]):
        done = runner.invoke(main, ["--database", url, *args], env={"COLUMNS": "200"})
        assert done.exit_code == 0, done.output
        outputs[" ".join(args)] = done.output
    for name, out in outputs.items():
        assert "\x1b" not in out, name
        assert "\r" not in out, name
        assert "\x07" not in out, name
    assert "\\x1b]0;owned\\x07" in outputs["status 1"]
    assert "\\u001b]0;owned\\u0007" in outputs["status 1 --json"]

    async def page() -> str:
        kirim = Kirim(Config(database=url))
        await kirim.open()
        try:
            transport = httpx.ASGITransport(app=create_app(kirim))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
                answer = await c.get("/dashboard/notifications/1")
                assert answer.status_code == 200
                return answer.text
        finally:
            await kirim.close()

    html = asyncio.run(page())
    assert "\x1b" not in html
    assert "\\x1b]0;owned\\x07" in html
