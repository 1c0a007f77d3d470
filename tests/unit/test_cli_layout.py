"""The CLI's tables at every terminal width: no word is ever broken across lines
(``recipien|t``), no key or id is ever cut (``e0fb…7050…``); a narrow terminal gets a
vertical layout instead, and a line longer than the terminal is one whole id."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from kirim.channels import Channel
from kirim.cli import main
from kirim.config import Config
from kirim.engine import Kirim
from kirim.errors import PermanentFailure
from kirim.keys import default_key
from kirim.notify import parse_type
from kirim.preferences import Preferences
from kirim.providers.base import Message, Sent

ERROR = "HTTP 404: no such recipient endpoint at the provider"
WIDTHS = [40, 60, 80, 100, 120, 200]


class Refusing:
    idempotent = False

    async def send(self, message: Message) -> Sent:
        raise PermanentFailure(ERROR)


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A suppressed delivery, two failed ones with a long recipient and a long error."""
    url = f"sqlite:///{tmp_path_factory.mktemp('layout') / 'k.db'}"

    async def build() -> None:
        shipped = parse_type("order_shipped", {"templates": {"email": {"body": "x"}}})
        kirim = Kirim(
            Config(database=url, max_attempts=1),
            channels={"email": Channel(name="email", provider=Refusing())},
            types=[shipped],
        )
        await kirim.open(migrate=True)
        try:
            opted = Preferences(recipient_id="u-1008", channels={"order_shipped:email": False})
            await kirim.set_preferences(opted)
            await kirim.notify_event(
                "order_shipped", ["u-1008", "u-1009"], {}, event_id="order-48291-shipped"
            )
            await kirim.notify("order-48292", "someone.long@example.com", "email", {"a": 1})
            await kirim.worker(worker_id="worker-7").run_once()
        finally:
            await kirim.close()

    asyncio.run(build())
    return url


def shown(database: str, width: int, *args: str) -> str:
    done = CliRunner().invoke(main, ["--database", database, *args], env={"COLUMNS": str(width)})
    assert done.exit_code == 0, done.output
    return done.stdout


def words_of(*texts: str) -> set[str]:
    return {w for t in texts for w in t.split()}


@pytest.mark.parametrize("width", WIDTHS)
def test_list_never_breaks_a_word(database: str, width: int) -> None:
    """kirim list and dead-letter list: every header, id, status and word of an error
    is whole in the output, at every width (at 80 columns 'recipient' was 're|ci|pi|en|t')."""
    for command in (["list"], ["dead-letter", "list"]):
        out = shown(database, width, *command)
        found = words_of(out)
        expected = words_of(
            "event recipient channel job tries last error",
            "order-48292 someone.long@example.com order-48291-shipped email failed dead",
            ERROR,
        )
        if command == ["list"]:
            expected |= words_of("u-1008 u-1009 suppressed (channel_opted_out) completed")
        assert expected <= found, (command, width, sorted(expected - found), out)
        for line in out.splitlines():
            assert len(line.rstrip()) <= width or len(line.split()) <= 2, (width, line)


@pytest.mark.parametrize("width", WIDTHS)
def test_status_never_cuts_a_key_or_an_id(database: str, width: int) -> None:
    """kirim status: the idempotency key, the event id, the worker and every request id
    appear whole (the key was cut to 'e0fb…7050…'), and no word is broken."""
    key = default_key("order-48291-shipped", "u-1009", "email")
    out = shown(database, width, "status", f"key:{key}")
    assert key in out
    assert "…" not in out
    found = words_of(out)
    assert words_of("order-48291-shipped u-1009 email failed") <= found, out
    assert words_of("no such recipient endpoint at the") <= found, out
    json_out = shown(database, 200, "status", f"key:{key}", "--json")
    request = json_out.split('"provider_request_id": "')[1].split('"')[0]
    assert request in out
    for line in out.splitlines():
        assert len(line.rstrip()) <= width or len(line.split()) <= 2, (width, line)
