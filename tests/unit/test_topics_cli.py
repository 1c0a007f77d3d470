"""`kirim topics subscribe|unsubscribe|list|show` from the command line (SQLite)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kirim.cli import main
from kirim.config import Config, load_config
from kirim.engine import Kirim
from kirim.observe.logging import configure

CONFIG = (
    '[channels.push]\nprovider = "webhook"\nurl = "http://127.0.0.1:9/hook"\n'
    '[types.news.templates.push]\ntitle = "{{ title }}"\n'
)


@pytest.fixture(autouse=True)
def _quiet_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("KIRIM_DATABASE_URL", raising=False)
    yield
    configure(level="warning")


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kirim.toml").write_text(CONFIG)
    url = f"sqlite:///{tmp_path / 'k.db'}"
    asyncio.run(_migrate(url))
    return url


async def _migrate(url: str) -> None:
    app = Kirim(Config(database=url))
    await app.open(migrate=True)
    await app.close()


def kirim(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--database", url, *args], catch_exceptions=False)


def test_subscribe_list_show_unsubscribe(db: str) -> None:
    """subscribe adds each recipient once; list and show count them; unsubscribe ends
    a subscription and exits 1 for one that had none."""
    done = kirim(db, "topics", "subscribe", "project:42", "u-1", "u-2")
    assert done.exit_code == 0, done.output
    assert "u-1 subscribed to project:42" in done.output
    again = kirim(db, "topics", "subscribe", "project:42", "u-1", "--json")
    assert json.loads(again.output)["created"] is False
    listed = json.loads(kirim(db, "topics", "list", "--json").output)
    assert [(t["topic"], t["subscribers"]) for t in listed["topics"]] == [("project:42", 2)]
    mine = json.loads(kirim(db, "topics", "list", "--recipient", "u-2", "--json").output)
    assert mine == {"recipient_id": "u-2", "topics": ["project:42"]}
    assert kirim(db, "topics", "unsubscribe", "project:42", "u-2").exit_code == 0
    assert kirim(db, "topics", "unsubscribe", "project:42", "u-2").exit_code == 1
    shown = kirim(db, "topics", "show", "project:42")
    assert shown.exit_code == 0
    assert "subscribers  1" in shown.output
    assert "fan-outs     none" in shown.output


def test_show_names_recent_fan_outs(db: str) -> None:
    """show lists a topic's latest events with how far each fan-out got."""
    kirim(db, "topics", "subscribe", "p", "u-1")

    async def send() -> None:
        app = Kirim(load_config("kirim.toml", database=db))
        await app.open()
        try:
            await app.notify_topic("news", "p", {"title": "hi"}, event_id="e-1")
        finally:
            await app.close()

    asyncio.run(send())
    data = json.loads(kirim(db, "topics", "show", "p", "--json").output)
    assert data["subscribers"] == 1
    assert [(e["event_id"], e["status"]) for e in data["recent"]] == [("e-1", "expanding")]


def test_show_of_an_unknown_topic_exits_1(db: str) -> None:
    """A topic nobody subscribed or sent to is not found."""
    done = kirim(db, "topics", "show", "nothing")
    assert done.exit_code == 1
    assert "no topic" in done.output


def test_every_topics_command_has_help_with_an_example() -> None:
    """Each command of `kirim topics` says what it does, with an example."""
    for name in ("subscribe", "unsubscribe", "list", "show"):
        done = CliRunner().invoke(main, ["topics", name, "--help"])
        assert done.exit_code == 0
        assert "Example" in done.output, name


def test_status_shows_the_topics_at_a_glance_and_one_topic(db: str) -> None:
    """`kirim status` without a delivery counts topics, subscriptions and topic events
    pending fan-out, expanding and done; `kirim status topic:T` shows one topic with
    each fan-out's progress."""
    kirim(db, "topics", "subscribe", "p", "u-1", "u-2")
    kirim(db, "topics", "subscribe", "q", "u-1")

    async def send() -> None:
        app = Kirim(load_config("kirim.toml", database=db))
        await app.open()
        try:
            for event_id in ("e-1", "e-2"):
                await app.notify_topic("news", "p", {"title": "hi"}, event_id=event_id)
            now = app.clock.now()
            got = await app.store.claim_topic_event(worker_id="w", now=now, lease=30.0)
            assert got is not None
            assert got.lease_token is not None
            items = await app.plan_topic_batch(got, ["u-1", "u-2"])
            await app.store.expand_topic_batch(
                got, got.lease_token, ["u-1", "u-2"], items, last=True, now=now, lease=30.0
            )
        finally:
            await app.close()

    asyncio.run(send())
    shown = kirim(db, "status")
    assert shown.exit_code == 0, shown.output
    assert "topics         2" in shown.output
    assert "subscriptions  3" in shown.output
    assert "1 pending fan-out, 0 expanding, 1 done" in shown.output
    data = json.loads(kirim(db, "status", "--json").output)
    assert data == {
        "topics": {
            "topics": 2,
            "subscriptions": 3,
            "events": {"pending": 1, "expanding": 0, "done": 1},
        }
    }
    one = kirim(db, "status", "topic:p")
    assert one.exit_code == 0, one.output
    assert "subscribers  2" in one.output
    assert "e-2  pending  0 recipients in 0 batches" in one.output
    assert "e-1  done  2 recipients in 1 batches" in one.output
    as_json = json.loads(kirim(db, "status", "topic:p", "--json").output)
    assert as_json == json.loads(kirim(db, "topics", "show", "p", "--json").output)
    assert kirim(db, "status", "topic:nothing").exit_code == 1
    assert kirim(db, "status", "topic:").exit_code == 2


def test_a_key_that_begins_with_topic_is_reached_as_key(db: str) -> None:
    """`kirim status topic:x` is the topic; the delivery keyed ``topic:x`` is
    `kirim status key:topic:x`."""
    made = kirim(db, "send", "--event", "e", "--recipient", "r", "--channel", "push",
                 "--key", "topic:x", "--payload", "{}")  # fmt: skip
    assert made.exit_code == 0, made.output
    assert kirim(db, "status", "topic:x").exit_code == 1  # no topic x
    found = kirim(db, "status", "key:topic:x", "--json")
    assert found.exit_code == 0, found.output
    assert json.loads(found.output)["idempotency_key"] == "topic:x"
