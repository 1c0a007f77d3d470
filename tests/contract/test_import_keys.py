"""``kirim import-keys``: another system's sent keys as tombstones, on both backends.

The switch of docs/adopting.md: keys the old system sent are imported, then kirim
is given the same notifications; none of them may be recorded (so none sent) again.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kirim.channels import Channel
from kirim.cli import main
from kirim.config import Config
from kirim.engine import Kirim
from kirim.keys import default_key
from kirim.model import DeliveryStatus
from kirim.store.imports import IMPORTED
from kirim.testing import FlakyProvider


def cli(url: str, *args: str, given: str | None = None) -> Result:
    return CliRunner().invoke(main, ["--database", url, *args], input=given)


@pytest.fixture
def url(database_url: str) -> str:
    assert cli(database_url, "migrate").exit_code == 0
    return database_url


def _app(url: str) -> Kirim:
    push = Channel(name="push", provider=FlakyProvider())
    return Kirim(Config(database=url), channels={"push": push})


def _notify(url: str, *calls: tuple[str, str, str | None]) -> list[tuple[bool, bool, int]]:
    """(created, pruned, delivery id) of each ``(event, recipient, key)`` given to notify."""

    async def go() -> list[tuple[bool, bool, int]]:
        app = _app(url)
        await app.open()
        try:
            out = []
            for event, recipient, key in calls:
                n = await app.notify(event, recipient, "push", {"title": "t"}, key=key)
                out.append((n.created, n.pruned, n.delivery_id))
            return out
        finally:
            await app.close()

    return asyncio.run(go())


def _pending_and_known(url: str) -> tuple[dict[str, int], DeliveryStatus]:
    async def go() -> tuple[dict[str, int], DeliveryStatus]:
        app = Kirim(Config(database=url))
        await app.open()
        try:
            record = await app.get("k-known")
            assert record is not None
            return (await app.store.counts())["deliveries"], record.delivery.status
        finally:
            await app.close()

    return asyncio.run(go())


def test_imported_keys_are_never_recorded_again(url: str) -> None:
    """An imported key makes notify create nothing (pruned, delivery id 0); a key kirim
    already has keeps its delivery; a key not imported is recorded as usual."""
    (before,) = _notify(url, ("e-0", "1007", "k-known"))
    done = cli(url, "import-keys", "-", given="k-1\nk-2\n\nk-1\nk-known\n")
    assert done.exit_code == 0, done.output
    assert "imported 2 keys as tombstones; 1 already known to kirim" in done.output
    results = _notify(
        url, ("e-1", "1007", "k-1"), ("e-2", "1008", "k-2"), ("e-0", "1007", "k-known"),
        ("e-3", "1009", "k-3"),
    )  # fmt: skip
    assert results[:2] == [(False, True, IMPORTED), (False, True, IMPORTED)]
    assert results[2] == (False, False, before[2])
    assert results[3][0] is True
    assert _pending_and_known(url) == ({"pending": 2}, DeliveryStatus.PENDING)


def test_a_second_import_and_a_dry_run_write_nothing(url: str) -> None:
    """The same file again imports nothing; --dry-run counts what it would import and
    writes nothing."""
    assert cli(url, "import-keys", "-", given="a\nb\n").exit_code == 0
    again = cli(url, "import-keys", "--json", "-", given="a\nb\n")
    assert json.loads(again.output)["imported"] == 0
    dry = cli(url, "import-keys", "--dry-run", "-", given="b\nc\nd\n")
    assert "would import 2 keys as tombstones; 1 already known" in dry.output
    wet = cli(url, "import-keys", "--json", "-", given="c\nd\n")
    assert json.loads(wet.output) == {
        "dry_run": False,
        "imported": 2,
        "known": 0,
        "expires_after_s": 365 * 86400.0,
    }


def test_csv_and_jsonl_records_name_keys_or_kirims_default_key(url: str, tmp_path: Path) -> None:
    """A CSV of event_id, recipient, channel imports kirim's default key of each row; a
    JSON line may give the key itself or the three fields."""
    table = tmp_path / "outbox.csv"
    table.write_text("event_id,recipient,channel,sent_at\no-1,1007,push,2026-11-30\n")
    assert cli(url, "import-keys", "--format", "csv", str(table)).exit_code == 0
    lines = '{"key": "celery-9"}\n{"event_id": "o-2", "recipient": "1008", "channel": "push"}\n'
    assert cli(url, "import-keys", "--format", "jsonl", "-", given=lines).exit_code == 0
    results = _notify(url, ("o-1", "1007", None), ("o-2", "1008", None), ("x", "1", "celery-9"))
    assert [r[:2] for r in results] == [(False, True)] * 3
    assert default_key("o-1", "1007", "push")  # the key the CSV row stood for


@pytest.mark.parametrize(
    ("fmt", "given", "says"),
    [
        ("keys", "ok-1\nbad key \n", "line 2: key must be printable ASCII"),
        ("jsonl", '{"key": "ok-1"}\n[1]\n', "line 2 is not a JSON object"),
        ("jsonl", '{"key": "ok-1"}\n{"event_id": "e"}\n', "line 2: the record has neither"),
        ("csv", "id,sent\n1,x\n", "the CSV header names neither key"),
    ],
)
def test_a_bad_record_stops_the_import_before_anything_is_written(
    url: str, fmt: str, given: str, says: str
) -> None:
    """A record that names no valid key exits 2 naming its line, and not even the good
    records before it are imported."""
    done = cli(url, "import-keys", "--format", fmt, "-", given=given)
    assert done.exit_code == 2, done.output
    assert says in done.output
    assert "nothing was imported" in done.output
    if fmt != "csv":
        ((created, pruned, _),) = _notify(url, ("e", "1", "ok-1"))
        assert (created, pruned) == (True, False)


def test_send_says_a_key_was_imported(url: str) -> None:
    """kirim send of an imported key says so instead of naming a delivery 0."""
    assert cli(url, "import-keys", "-", given="k-9\n").exit_code == 0
    done = cli(
        url, "send", "--event", "e", "--recipient", "r", "--channel", "push",
        "--payload", "{}", "--key", "k-9",
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "was imported as already sent (kirim import-keys): not created" in done.output
