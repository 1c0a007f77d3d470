"""`kirim prefs show|set|clear` from the command line (SQLite)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kirim.cli import main
from kirim.config import Config
from kirim.engine import Kirim
from kirim.observe.logging import configure
from kirim.preferences import Preferences, Window


@pytest.fixture(autouse=True)
def _quiet_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("KIRIM_DATABASE_URL", raising=False)
    yield
    configure(level="warning")


#: the types and channels the tests' preferences name
CONFIG = "".join(
    f'[channels.{c}]\nprovider = "webhook"\nurl = "http://127.0.0.1:9/hook"\n'
    for c in ("push", "sms", "b")
) + "".join(f'[types.{t}.templates.push]\ntitle = "t"\n' for t in ("order_shipped", "a", "c"))


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)  # no ./kirim.toml but the test's
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


def stored(url: str, recipient_id: str = "u-1") -> Preferences | None:
    async def go() -> Preferences | None:
        app = Kirim(Config(database=url))
        await app.open()
        try:
            return await app.preferences(recipient_id)
        finally:
            await app.close()

    return asyncio.run(go())


def test_set_then_show(db: str) -> None:
    """set writes what its options name; show prints it, as text and as JSON."""
    done = kirim(
        db,
        "prefs",
        "set",
        "u-1",
        "--timezone",
        "Asia/Jakarta",
        "--quiet-hours",
        "22:00-07:00",
        "--channel",
        "order_shipped:sms=off",
        "--channel",
        "*:push=on",
    )
    assert done.exit_code == 0, done.output
    assert "quiet_hours  22:00-07:00" in done.stdout
    found = stored(db)
    assert found is not None
    assert found.timezone == "Asia/Jakarta"
    assert found.quiet_hours == Window.parse("22:00-07:00")
    assert found.channels == {"order_shipped:sms": False, "*:push": True}
    shown = kirim(db, "prefs", "show", "u-1", "--json")
    assert shown.exit_code == 0
    data = json.loads(shown.stdout)
    assert data["recipient_id"] == "u-1"
    assert data["quiet_hours"] == {"start": "22:00", "end": "07:00"}
    text = kirim(db, "prefs", "show", "u-1")
    assert "order_shipped:sms off" in text.stdout
    assert "Asia/Jakarta" in text.stdout


def test_set_changes_only_what_it_names(db: str) -> None:
    """A second set keeps the rest; unset forgets one channel entry; none clears."""
    kirim(db, "prefs", "set", "u-1", "--timezone", "Europe/Berlin", "--channel", "a:b=off")
    kirim(db, "prefs", "set", "u-1", "--opt-out", "--channel", "c:*=on")
    found = stored(db)
    assert found is not None
    assert found.opt_out
    assert found.timezone == "Europe/Berlin"
    assert found.channels == {"a:b": False, "c:*": True}
    kirim(db, "prefs", "set", "u-1", "--opt-in", "--channel", "a:b=unset", "--timezone", "none")
    found = stored(db)
    assert found is not None
    assert not found.opt_out
    assert found.timezone is None
    assert found.channels == {"c:*": True}


def test_replace_starts_from_the_defaults(db: str) -> None:
    kirim(db, "prefs", "set", "u-1", "--opt-out", "--timezone", "Europe/Berlin")
    done = kirim(db, "prefs", "set", "u-1", "--replace", "--quiet-hours", "23:00-06:00")
    assert done.exit_code == 0
    assert stored(db) == Preferences(
        recipient_id="u-1",
        quiet_hours=Window.parse("23:00-06:00"),
        updated_at=stored(db).updated_at,  # type: ignore[union-attr]
    )


@pytest.mark.parametrize(
    ("switch", "message"),
    [
        ("order_shiped:push=off", "names the type 'order_shiped', which is not configured "
         "(known: a, c, order_shipped)"),
        ("order_shipped:sns=off", "names the channel 'sns', which is not configured "
         "(known: b, push, sms)"),
        ("nope:*=on", "names the type 'nope'"),
    ],
)  # fmt: skip
def test_set_refuses_a_type_or_channel_that_is_not_configured(
    db: str, switch: str, message: str
) -> None:
    """A type or channel name that the configuration does not have exits 2 naming the
    known ones, and nothing is stored: a typo would never match a delivery."""
    done = kirim(db, "prefs", "set", "u-1", "--channel", switch)
    assert done.exit_code == 2, done.output
    assert message in done.output
    assert stored(db) is None
    assert kirim(db, "prefs", "set", "u-1", "--channel", "*:sms=off").exit_code == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--timezone", "Mars/Olympus"], "--timezone is not a known IANA time zone"),
        (["--quiet-hours", "22-07"], "--quiet-hours must be HH:MM-HH:MM"),
        (["--channel", "email=off"], "--channel 'email' must be TYPE:CHANNEL"),
        (["--channel", "a:b=maybe"], "--channel must be TYPE:CHANNEL=on|off|unset"),
    ],
)
def test_a_bad_option_is_a_usage_error_naming_it(db: str, args: list[str], message: str) -> None:
    """Exit 2, one line on stderr, nothing written."""
    done = kirim(db, "prefs", "set", "u-1", *args)
    assert done.exit_code == 2
    assert message in done.stderr
    assert stored(db) is None


def test_show_and_clear_of_a_recipient_without_preferences_exit_1(db: str) -> None:
    shown = kirim(db, "prefs", "show", "nobody")
    assert shown.exit_code == 1
    assert "has no preferences" in shown.stderr
    assert kirim(db, "prefs", "clear", "nobody").exit_code == 1


def test_clear_forgets_them(db: str) -> None:
    kirim(db, "prefs", "set", "u-1", "--opt-out")
    done = kirim(db, "prefs", "clear", "u-1")
    assert done.exit_code == 0
    assert "cleared" in done.stdout
    assert stored(db) is None


def test_every_command_has_help(db: str) -> None:
    for command in ([], ["show"], ["set"], ["clear"]):
        done = kirim(db, "prefs", *command, "--help")
        assert done.exit_code == 0
        assert "Example" in done.stdout


def test_sync_kirim_has_the_preference_verbs(db: str) -> None:
    """SyncKirim.preferences / set_preferences / delete_preferences, as the async ones."""
    from kirim.sync import SyncKirim

    with SyncKirim(Config(database=db)) as app:
        assert app.preferences("u-1") is None
        done = app.set_preferences(Preferences(recipient_id="u-1", opt_out=True))
        assert done.updated_at is not None
        assert app.preferences("u-1") == done
        assert app.delete_preferences("u-1") is True
        assert app.delete_preferences("u-1") is False


def test_status_and_list_say_why_a_delivery_is_suppressed(db: str) -> None:
    """A delivery the claim suppressed: `kirim status` and `kirim list --status
    suppressed` print the reason beside the status, and its type."""
    from kirim.keys import payload_hash
    from kirim.preferences import TypePolicy
    from kirim.store.base import NewDelivery

    async def go() -> int:
        app = Kirim(Config(database=db))
        await app.open()
        try:
            item = NewDelivery(
                idempotency_key="k-1",
                event_id="e-1",
                recipient="u-1@example.com",
                channel="push",
                payload_json="{}",
                payload_hash=payload_hash("{}"),
                run_at=None,
                max_attempts=3,
                type="order_shipped",
                recipient_id="u-1",
            )
            [made] = await app.store.enqueue([item], now=app.clock.now())
            await app.set_preferences(Preferences(recipient_id="u-1", opt_out=True))
            policies = {"order_shipped": TypePolicy(name="order_shipped")}
            await app.store.claim(
                worker_id="w", now=app.clock.now(), lease=10, limit=5, policies=policies
            )
            return made.delivery.id
        finally:
            await app.close()

    delivery_id = asyncio.run(go())
    status = kirim(db, "status", str(delivery_id))
    assert status.exit_code == 0, status.output
    assert "suppressed (opted_out)" in status.stdout
    assert "order_shipped for u-1" in status.stdout
    listed = kirim(db, "list", "--status", "suppressed")
    assert listed.exit_code == 0, listed.output
    assert "suppressed (opted_out)" in listed.stdout
