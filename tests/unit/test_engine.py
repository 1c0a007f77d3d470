"""notify(): keys, validation, idempotent replays; the sync wrapper."""

from __future__ import annotations

import sqlite3
import types
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

import kirim
from kirim.channels import Channel
from kirim.config import Config, parse_config
from kirim.engine import Kirim
from kirim.errors import (
    ActionRefused,
    ConfigError,
    IdempotencyKeyReused,
    InvalidNotification,
    PayloadTooLarge,
    SchemaError,
    UnknownChannel,
)
from kirim.keys import default_key
from kirim.model import DeliveryStatus
from kirim.providers.base import Message, Sent
from kirim.sync import SyncKirim
from kirim.testing import FlakyProvider
from kirim.worker import WorkerSettings


def test_default_key_is_the_seed_formula() -> None:
    """The default key is sha256 of event, user and channel, as in the write-up."""
    import hashlib

    expect = hashlib.sha256(b"event:48291:user:1007:channel:push").hexdigest()
    assert default_key("48291", "1007", "push") == expect


async def test_same_key_same_payload_returns_existing(make_app) -> None:
    """Notifying the same business action twice returns the first delivery."""
    app = await make_app()
    first = await app.notify("48291", "1007", "push", {"b": 1, "a": 2})
    again = await app.notify("48291", "1007", "push", {"a": 2, "b": 1})  # same JSON, other order
    assert first.created
    assert not again.created
    assert again.delivery_id == first.delivery_id
    assert first.idempotency_key == default_key("48291", "1007", "push")


async def test_same_key_other_payload_is_refused(make_app) -> None:
    """A reused key with a different payload raises IdempotencyKeyReused."""
    app = await make_app()
    await app.notify("e", "u", "push", {"a": 1}, key="k-1")
    with pytest.raises(IdempotencyKeyReused, match="k-1"):
        await app.notify("e2", "u", "push", {"a": 2}, key="k-1")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"event_id": "e2"}, "event_id"),
        ({"recipient": "u2"}, "recipient"),
        ({"payload": {"a": 2}}, "payload"),
        ({"event_id": "e2", "payload": {"a": 2}}, "event_id"),
        ({"recipient": "u2", "payload": {"a": 2}}, "recipient"),
    ],
)
async def test_a_key_reused_for_another_notification_names_the_field(
    make_app, change, field
) -> None:
    """A key reused with another event, recipient or payload raises, naming the field
    (event and recipient are compared before the payload)."""
    app = await make_app()
    first = {"event_id": "e", "recipient": "u", "channel": "push", "payload": {"a": 1}}
    made = await app.notify(**first, key="k-1")
    with pytest.raises(IdempotencyKeyReused, match=f"different {field};") as caught:
        await app.notify(**{**first, **change}, key="k-1")
    assert (caught.value.key, caught.value.delivery_id) == ("k-1", made.delivery_id)
    assert caught.value.field == field
    assert (await app.store.counts())["deliveries"] == {"pending": 1}


async def test_a_key_reused_on_another_channel_names_the_channel(make_app) -> None:
    """A key reused on another channel (same event, recipient, payload) raises, naming it."""
    push, sms = await make_app(channel="push"), await make_app(channel="sms")
    await push.notify("e", "u", "push", {"a": 1}, key="k-1")
    with pytest.raises(IdempotencyKeyReused, match="different channel;") as caught:
        await sms.notify("e", "u", "sms", {"a": 2}, key="k-1")
    assert caught.value.field == "channel"


def test_key_reused_keeps_its_constructor() -> None:
    """IdempotencyKeyReused(key, delivery_id) still works and means a payload conflict."""
    error = IdempotencyKeyReused("k-1", 7)
    assert (error.key, error.delivery_id, error.field) == ("k-1", 7, "payload")
    assert "delivery 7 with a different payload" in str(error)


@pytest.mark.parametrize("bad", ["\x00", "\ud800"])
@pytest.mark.parametrize("name", ["key", "event_id", "recipient", "channel"])
async def test_text_no_backend_can_store_is_refused(make_app, name, bad) -> None:
    """NUL or a lone surrogate in the key, event, recipient or channel raises
    InvalidNotification naming the field, and writes nothing."""
    app = await make_app()
    fields = {"event_id": "e", "recipient": "u", "channel": "push", "key": "k"}
    fields[name] = f"a{bad}b"
    key = fields.pop("key")
    with pytest.raises(InvalidNotification, match=f"^{name} must"):
        await app.notify(**fields, payload={}, key=key)
    assert (await app.store.counts())["deliveries"] == {}


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("", "u", "push", {}), InvalidNotification, "event_id is required"),
        (("e", "  ", "push", {}), InvalidNotification, "recipient is required"),
        (("e", "u", "sms", {}), UnknownChannel, "unknown channel 'sms'"),
        (("e", "u", "push", {"x": {1, 2}}), InvalidNotification, "payload is not JSON"),
        (("e", "u", "push", {"x": float("nan")}), InvalidNotification, "payload is not JSON"),
        (("e", "u", "push", {"x": "a" * 300_000}), PayloadTooLarge, "over the limit of 262144"),
    ],
)
async def test_bad_input_raises_and_writes_nothing(make_app, args, error, message) -> None:
    """Bad input raises a typed error with a clear message and writes nothing."""
    app = await make_app()
    with pytest.raises(error, match=message):
        await app.notify(*args)
    assert (await app.store.counts())["deliveries"] == {}


async def test_send_after_forms(make_app, clock) -> None:
    """send_after takes an aware datetime, a timedelta or epoch seconds; naive is refused."""
    app = await make_app()
    n1 = await app.notify("e1", "u", "push", {}, send_after=timedelta(minutes=5))
    when = datetime.fromtimestamp(clock.now() + 60, tz=UTC)
    n2 = await app.notify("e2", "u", "push", {}, send_after=when)
    assert (await app.store.get_job(n1.delivery_id)).run_at == clock.now() + 300
    assert (await app.store.get_job(n2.delivery_id)).run_at == pytest.approx(clock.now() + 60)
    with pytest.raises(InvalidNotification, match="timezone-aware"):
        await app.notify("e3", "u", "push", {}, send_after=datetime(2030, 1, 1))


async def test_open_refuses_a_schema_newer_than_the_code(tmp_path: Path) -> None:
    """A database migrated by a newer kirim is refused with a clear message."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    app = Kirim(Config(database=url), channels={})
    await app.open(migrate=True)
    await app.close()
    with sqlite3.connect(tmp_path / "k.db") as db:
        db.execute("UPDATE kirim_meta SET value = '99' WHERE key = 'schema_version'")
    app = Kirim(Config(database=url), channels={})
    with pytest.raises(SchemaError, match="schema version 99"):
        await app.open()
    await app.close()


def test_sync_wrapper_notifies_without_an_event_loop(tmp_path: Path) -> None:
    """SyncKirim offers notify() and get() to code that is not async."""
    channel = kirim.Channel(name="push", provider=FlakyProvider())
    url = f"sqlite:///{tmp_path / 'k.db'}"
    with SyncKirim(Config(database=url), channels={"push": channel}).open(migrate=True) as app:
        n = app.notify("e", "u", "push", {"hello": "world"})
        record = app.get(n.delivery_id)
        delivery, job, attempts = record.delivery, record.job, record.attempts
    assert delivery.status is DeliveryStatus.PENDING
    assert job is not None
    assert attempts == []


def test_sync_wrapper_has_the_operator_verbs(tmp_path: Path) -> None:
    """SyncKirim lists, cancels and refuses as Kirim does."""
    channel = kirim.Channel(name="push", provider=FlakyProvider())
    url = f"sqlite:///{tmp_path / 'k.db'}"
    with SyncKirim(Config(database=url), channels={"push": channel}).open(migrate=True) as app:
        ids = [app.notify(f"e{i}", "u", "push", {}).delivery_id for i in range(3)]
        page = app.records(limit=2)
        assert [r.delivery.id for r in page.records] == ids[:0:-1]
        assert page.next_cursor == ids[1]
        assert app.cancel(ids[0]).delivery.status is DeliveryStatus.CANCELED
        with pytest.raises(ActionRefused, match="not dead-lettered"):
            app.retry(ids[1])
        assert app.dead_letters() == []
        assert app.in_doubt() == []


def test_public_api_is_exactly_all() -> None:
    """Every public name is in kirim.__all__ and importable from kirim."""
    public = {
        name
        for name in dir(kirim)
        if not name.startswith("_") and not isinstance(getattr(kirim, name), types.ModuleType)
    }
    assert public == set(kirim.__all__) - {"__version__"}
    for name in kirim.__all__:
        assert getattr(kirim, name) is not None


@pytest.mark.parametrize(
    "payload",
    [
        {"t": "\ud800"},
        {"t": "a\x00b"},
        {"deep": [{"x": ["ok", "\udfff"]}]},
        {"key\x00": 1},
        {"nested": {"\ud800": "v"}},
    ],
)
async def test_nul_and_lone_surrogates_anywhere_in_the_payload_are_refused(
    make_app, payload
) -> None:
    """NUL or a lone surrogate in any payload key or string value, however deep, raises
    InvalidNotification on both backends and writes nothing."""
    app = await make_app()
    with pytest.raises(InvalidNotification, match=r"must (not contain NUL|be valid Unicode)"):
        await app.notify("e", "u", "push", payload)
    assert (await app.store.counts())["deliveries"] == {}


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("k" * 256, "key must be at most 255 characters, not 256"),
        ("k" * 100_000, "key must be at most 255 characters, not 100000"),
        ("clé-1", "key must be printable ASCII"),
        ("k\r\nX-Injected: 1", "key must be printable ASCII"),
    ],
)
async def test_explicit_keys_are_capped_and_ascii(make_app, key, message) -> None:
    """An explicit key over 255 characters or outside printable ASCII (it goes out in an
    HTTP header) raises InvalidNotification on both backends; 255 characters pass."""
    app = await make_app()
    with pytest.raises(InvalidNotification, match=message):
        await app.notify("e", "u", "push", {}, key=key)
    assert (await app.store.counts())["deliveries"] == {}
    n = await app.notify("e", "u", "push", {}, key="k" * 255)
    assert n.idempotency_key == "k" * 255


@pytest.mark.parametrize(
    "when",
    [
        timedelta(days=999_999_999),
        timedelta(days=-999_999_999),
        1e308,
        float("inf"),
        float("nan"),
        10**400,
        -1.0,
        datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-23))),
    ],
)
async def test_send_after_beyond_any_calendar_is_refused(make_app, when) -> None:
    """A send_after outside 1970..9999 (huge, infinite, nan) is InvalidNotification in one
    line, not an OverflowError now or a crash of every later `status`."""
    app = await make_app()
    with pytest.raises(InvalidNotification, match="send_after must fall between 1970-01-01"):
        await app.notify("e", "u", "push", {}, send_after=when)
    assert (await app.store.counts())["deliveries"] == {}


class ReadmeProvider:
    """A provider exactly as the README describes one: idempotent and send, no aclose."""

    idempotent = False

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send(self, message: Message) -> Sent:
        self.sent.append(message.idempotency_key)
        return Sent(provider_message_id="m-1")


async def test_a_provider_with_only_idempotent_and_send_works(make_app) -> None:
    """A provider without aclose() delivers, and the app closes without AttributeError."""
    provider = ReadmeProvider()
    app = await make_app(provider)
    n = await app.notify("e", "u", "push", {"a": 1})
    assert await app.worker(settings=WorkerSettings(lease=10), worker_id="A").run_once() == 1
    delivery = (await app.get(n.delivery_id)).delivery
    assert delivery.status is DeliveryStatus.SENT
    assert provider.sent == [n.idempotency_key]
    await app.close()


def test_a_channel_refuses_what_is_not_a_provider() -> None:
    """A Channel whose provider lacks an async send() or a bool idempotent raises at once."""
    with pytest.raises(ValueError, match="dict is not a provider"):
        Channel(name="push", provider={"url": "x"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="idempotent attribute must be True or False"):
        Channel(name="push", provider=types.SimpleNamespace(send=ReadmeProvider().send))  # type: ignore[arg-type]


def test_channels_of_a_factory_returning_a_non_provider_fail_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kirim.channels() (what the worker calls first) raises ConfigError for a factory
    that returns a non-provider: before any delivery, not after the first one."""
    (tmp_path / "bad_factory.py").write_text("def make(**options):\n    return object()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = parse_config(
        {
            "database": f"sqlite:///{tmp_path / 'k.db'}",
            "channels": {"push": {"provider": "bad_factory:make"}},
        }
    )
    with pytest.raises(
        ConfigError, match=r"channels\.push\.provider 'bad_factory:make' returned object"
    ):
        Kirim(config).channels()
