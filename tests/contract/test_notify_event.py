"""notify_event() on every backend: one event rendered and fanned out to a delivery per
recipient x channel in one transaction, or refused whole with nothing written."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim, NotifyRequest
from kirim.errors import IdempotencyKeyReused, InvalidNotification, KirimError
from kirim.keys import default_key
from kirim.model import DeliveryStatus, JobStatus
from kirim.notify import NotificationType, Recipient, RenderError, parse_type
from kirim.observe.metrics import Metrics
from kirim.preferences import Preferences, Window
from kirim.sync import SyncKirim
from kirim.testing import FlakyProvider, ManualClock

#: 2026-12-01 12:00 UTC
NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()

SHIPPED = {
    "templates": {
        "email": {
            "subject": "Order {{ order_id }} has shipped",
            "body": "Total {{ total | currency('IDR') }}, shipped {{ at | date('long') }}.",
            "html": "<p>Hi {{ name }}</p>",
            "id": {
                "subject": "Pesanan {{ order_id }} telah dikirim",
                "body": "Total {{ total | currency('IDR') }}, dikirim {{ at | date('long') }}.",
            },
        },
        "push": {"title": "Shipped: {{ order_id }}"},
    }
}
DATA = {"order_id": "48291", "total": 1500000, "at": "2026-12-01T10:00:00+07:00", "name": "<B>"}

App = Callable[..., Awaitable[Kirim]]


@pytest.fixture
def providers() -> dict[str, FlakyProvider]:
    """The providers of channels email and push, shared by the test's apps."""
    return {name: FlakyProvider() for name in ("email", "push")}


@pytest.fixture
async def make(database_url: str, providers: dict[str, FlakyProvider]) -> AsyncIterator[App]:
    """Apps on one database with channels email and push, the types given, a manual
    clock at noon and their own metrics."""
    async with _apps(database_url, providers) as build:
        yield build


@contextlib.asynccontextmanager
async def _apps(url: str, providers: dict[str, FlakyProvider]) -> AsyncIterator[App]:
    apps: list[Kirim] = []

    async def build(*types: NotificationType, clock: ManualClock | None = None) -> Kirim:
        app = Kirim(
            Config(database=url),
            channels={n: Channel(name=n, provider=p) for n, p in providers.items()},
            clock=clock or ManualClock(NOON),
            metrics=Metrics(),
            types=types or (parse_type("order_shipped", SHIPPED),),
        )
        await app.open(migrate=True)
        apps.append(app)
        return app

    try:
        yield build
    finally:
        for app in apps:
            await app.close()


async def everything(app: Kirim) -> list[Any]:
    """Every delivery with its job, oldest first."""
    page = await app.records(limit=500)
    return sorted(page.records, key=lambda r: r.delivery.id)


# -- the fan-out -----------------------------------------------------------------------


async def test_an_event_fans_out_to_every_recipient_and_channel(make: App) -> None:
    """Two recipients x two channels: four deliveries, each with its key and message."""
    app = await make()
    result = await app.notify_event(
        "order_shipped",
        [Recipient("u1", to={"email": "u1@example.com"}), "u2"],
        DATA,
        event_id="order-48291",
    )
    assert [(d.recipient_id, d.channel, d.created) for d in result.deliveries] == [
        ("u1", "email", True),
        ("u1", "push", True),
        ("u2", "email", True),
        ("u2", "push", True),
    ]
    records = await everything(app)
    assert len(records) == 4
    for d, job in ((r.delivery, r.job) for r in records):
        assert d.idempotency_key == default_key("order-48291", d.recipient_id, d.channel)
        assert d.type == "order_shipped"
        assert d.status == DeliveryStatus.PENDING
        assert job.status == JobStatus.QUEUED
    email = records[0].delivery
    assert (email.recipient, email.recipient_id) == ("u1@example.com", "u1")
    assert email.payload == {
        "type": "order_shipped",
        "locale": "en",
        "subject": "Order 48291 has shipped",
        "body": "Total IDR1,500,000, shipped December 1, 2026.",
        "html": "<p>Hi &lt;B&gt;</p>",
    }
    assert records[1].delivery.payload == {
        "type": "order_shipped",
        "locale": "en",
        "title": "Shipped: 48291",
    }
    assert result.to_json()["deliveries"][0]["status"] == "pending"


async def test_the_same_event_again_makes_nothing_new(make: App) -> None:
    """A retried notify_event returns the deliveries it made (created false)."""
    app = await make()
    first = await app.notify_event("order_shipped", ["u1", "u2"], DATA, event_id="e-1")
    again = await app.notify_event("order_shipped", ["u2", "u1"], DATA, event_id="e-1")
    assert {d.delivery_id for d in first.deliveries} == {d.delivery_id for d in again.deliveries}
    assert not any(d.created for d in again.deliveries)
    assert len(await everything(app)) == 4


async def test_a_reused_event_id_writes_nothing_even_for_a_new_recipient(make: App) -> None:
    """The same event id with other data, now also to u3: the keys of u1 name other
    payloads, so the event is refused whole; u3 gets no delivery either (fails on the
    store that checked after its commit)."""
    app = await make()
    await app.notify_event("order_shipped", ["u1"], DATA, event_id="e-1")
    other = {**DATA, "order_id": "1"}
    with pytest.raises(IdempotencyKeyReused, match="different payload"):
        await app.notify_event("order_shipped", ["u1", "u3"], other, event_id="e-1")
    assert {r.delivery.recipient_id for r in await everything(app)} == {"u1"}


async def test_a_batch_with_one_reused_key_writes_nothing(make: App) -> None:
    """notify_many: one request whose key names another payload refuses the batch."""
    app = await make()
    await app.notify("e-1", "u1", "push", {"n": 1}, key="k-1")
    batch = [
        NotifyRequest(event_id="e-2", recipient="u2", channel="push", payload={}),
        NotifyRequest(event_id="e-1", recipient="u1", channel="push", payload={"n": 2}, key="k-1"),
    ]
    with pytest.raises(IdempotencyKeyReused):
        await app.notify_many(batch)
    assert [r.delivery.idempotency_key for r in await everything(app)] == ["k-1"]


async def test_the_fan_out_is_one_transaction(make: App, database_url: str) -> None:
    """A failure writing the last job rolls back every delivery of the event."""
    app = await make()
    _fail_jobs_of(database_url, recipient="u3")
    with pytest.raises(KirimError):
        await app.notify_event("order_shipped", ["u1", "u2", "u3"], DATA, event_id="e-1")
    assert await everything(app) == []


def _fail_jobs_of(url: str, *, recipient: str) -> None:
    """A trigger in the database itself: inserting a job of ``recipient``'s fails."""
    if url.startswith("sqlite:"):
        from kirim.store.sqlite import sqlite_path

        with sqlite3.connect(sqlite_path(url)[0]) as db:
            db.execute(
                "CREATE TRIGGER boom BEFORE INSERT ON kirim_jobs WHEN (SELECT recipient_id FROM "
                f"kirim_deliveries WHERE id = NEW.delivery_id) = '{recipient}' "
                "BEGIN SELECT RAISE(ABORT, 'boom'); END"
            )
        db.close()
        return
    import psycopg

    from kirim.store.postgres import postgres_conninfo

    with psycopg.connect(postgres_conninfo(url)[0], autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF (SELECT recipient_id FROM kirim_deliveries WHERE id = NEW.delivery_id) = "
            f"'{recipient}' THEN RAISE EXCEPTION 'boom'; END IF; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER boom BEFORE INSERT ON kirim_jobs FOR EACH ROW EXECUTE FUNCTION boom()"
        )


# -- refused whole ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "source", ["{{ ''.__class__.__mro__ }}", "{{ cycler.__init__.__globals__ }}"]
)
async def test_a_template_reaching_python_internals_writes_nothing(make: App, source: str) -> None:
    """The sandbox refuses it: a clear RenderError, and no delivery at all."""
    evil = parse_type("evil", {"templates": {"email": {"body": "ok"}, "push": {"body": source}}})
    app = await make(evil)
    with pytest.raises(RenderError, match="refused by the sandbox") as caught:
        await app.notify_event("evil", ["u1", "u2"], {}, event_id="e-1")
    assert "types.evil.templates.push.body" in str(caught.value)
    assert await everything(app) == []


async def test_a_missing_variable_names_it_and_writes_nothing(make: App) -> None:
    """One recipient's variant lacks a variable: the whole event is refused."""
    ntype = parse_type(
        "t",
        {"templates": {"push": {"title": "Hi", "id": {"title": "Halo {{ nama }}"}}}},
    )
    app = await make(ntype)
    with pytest.raises(RenderError, match="'nama' is undefined") as caught:
        await app.notify_event("t", ["u1", Recipient("u2", locale="id")], {}, event_id="e-1")
    assert "types.t.templates.push.id.title (line 1)" in str(caught.value)
    assert await everything(app) == []


@pytest.mark.parametrize(
    ("call", "match"),
    [
        ({"type": "nope"}, "unknown notification type 'nope'"),
        ({"recipients": []}, "non-empty list"),
        ({"data": {"kirim": 1}}, "'kirim'"),
        ({"event_id": "\x00"}, "NUL"),
    ],
)
async def test_bad_input_writes_nothing(make: App, call: dict[str, Any], match: str) -> None:
    """An unknown type, no recipients, a reserved field, a bad id: refused, nothing written."""
    app = await make()
    args = {"type": "order_shipped", "recipients": ["u1"], "data": DATA, "event_id": "e", **call}
    with pytest.raises(InvalidNotification, match=match):
        await app.notify_event(
            args["type"], args["recipients"], args["data"], event_id=args["event_id"]
        )
    assert await everything(app) == []


# -- locales ---------------------------------------------------------------------------


async def test_each_recipient_gets_its_locale_or_the_fallback(make: App) -> None:
    """id_ID -> the id variant, formatted in id_ID; fr -> the default locale."""
    app = await make()
    people = [
        Recipient("a", locale="id_ID"),
        Recipient("b", locale="id"),
        Recipient("c", locale="fr"),
    ]
    result = await app.notify_event("order_shipped", people, DATA, event_id="e-1")
    payloads = {}
    for entry in result.deliveries:
        if entry.channel == "email":
            record = await app.get(entry.delivery_id, by="id")
            assert record is not None
            payloads[entry.recipient_id] = record.delivery.payload
    assert payloads["a"]["subject"] == "Pesanan 48291 telah dikirim"
    assert payloads["a"]["body"] == "Total Rp1.500.000, dikirim 1 Desember 2026."
    assert payloads["a"]["html"] == "<p>Hi &lt;B&gt;</p>"  # no id variant: the default's
    assert payloads["b"]["locale"] == payloads["a"]["locale"] == "id"
    assert payloads["c"]["locale"] == "en"
    assert payloads["c"]["subject"] == "Order 48291 has shipped"


# -- preferences at enqueue ------------------------------------------------------------


async def test_an_opted_out_recipient_is_recorded_suppressed(make: App, providers: Any) -> None:
    """Suppressed with its reason, its job completed: a worker sends only the others."""
    app = await make()
    await app.set_preferences(Preferences(recipient_id="u1", opt_out=True))
    await app.set_preferences(
        Preferences(recipient_id="u2", channels={"order_shipped:push": False})
    )
    result = await app.notify_event("order_shipped", ["u1", "u2"], DATA, event_id="e-1")
    got = {(d.recipient_id, d.channel): (str(d.status), d.reason) for d in result.deliveries}
    assert got == {
        ("u1", "email"): ("suppressed", "opted_out"),
        ("u1", "push"): ("suppressed", "opted_out"),
        ("u2", "email"): ("pending", None),
        ("u2", "push"): ("suppressed", "channel_opted_out"),
    }
    for d, job in ((r.delivery, r.job) for r in await everything(app)):
        assert (d.status == DeliveryStatus.SUPPRESSED) == (job.status == JobStatus.COMPLETED)
    metrics = app.metrics.render().decode()  # type: ignore[union-attr]
    assert 'kirim_suppressed_total{channel="email",reason="opted_out"} 1.0' in metrics
    assert 'kirim_suppressed_total{channel="push",reason="channel_opted_out"} 1.0' in metrics
    await app.worker().run(burst=True)
    assert [m.recipient for m in providers["email"].requests] == ["u2"]
    assert providers["push"].requests == []


async def test_a_critical_type_reaches_an_opted_out_recipient(make: App) -> None:
    """critical = true ignores the opt-out at enqueue."""
    app = await make(parse_type("alert", {"critical": True, "templates": {"push": {"body": "!"}}}))
    await app.set_preferences(Preferences(recipient_id="u1", opt_out=True))
    result = await app.notify_event("alert", ["u1"], {}, event_id="e-1")
    assert [d.status for d in result.deliveries] == [DeliveryStatus.PENDING]


async def test_quiet_hours_defer_the_job(make: App, providers: Any) -> None:
    """Noon UTC is 19:00 in Jakarta, inside quiet hours 18:00-07:00: due at 07:00 there."""
    app = await make()
    quiet = Window.parse("18:00-07:00")
    await app.set_preferences(
        Preferences(recipient_id="u1", timezone="Asia/Jakarta", quiet_hours=quiet)
    )
    result = await app.notify_event("order_shipped", ["u1"], DATA, event_id="e-1")
    opening = datetime(2026, 12, 2, 0, 0, tzinfo=UTC).timestamp()
    assert [d.run_at for d in result.deliveries] == [opening, opening]
    for job in (r.job for r in await everything(app)):
        assert job.run_at == opening
    await app.worker().run(burst=True)
    assert providers["push"].requests == []


# -- what the worker sends -------------------------------------------------------------


async def test_the_worker_sends_what_was_rendered(make: App, providers: Any) -> None:
    """The provider gets the payload recorded at enqueue, to the channel's address."""
    app = await make()
    await app.notify_event(
        "order_shipped", [Recipient("u1", to={"email": "u1@example.com"})], DATA, event_id="e-1"
    )
    await app.worker().run(burst=True)
    [email] = providers["email"].requests
    assert (email.recipient, email.payload["subject"]) == (
        "u1@example.com",
        "Order 48291 has shipped",
    )
    [push] = providers["push"].requests
    assert push.payload == {"type": "order_shipped", "locale": "en", "title": "Shipped: 48291"}
    assert {str(r.delivery.status) for r in await everything(app)} == {"sent"}


# -- throttle and digest (the store's: kirim.store.throttle, kirim.store.digests) -------


async def test_a_throttled_type_suppresses_over_its_limit(make: App) -> None:
    """limit 2 per hour per recipient: the third event's delivery is throttled."""
    ntype = parse_type(
        "ping",
        {
            "throttle": {"limit": 2, "window": "1h"},
            "templates": {"push": {"title": "ping {{ n }}"}},
        },
    )
    app = await make(ntype)
    seen = []
    for n in range(3):
        result = await app.notify_event("ping", ["u1"], {"n": n}, event_id=f"e-{n}")
        seen.append((str(result.deliveries[0].status), result.deliveries[0].reason))
    assert seen == [("pending", None), ("pending", None), ("suppressed", "throttled")]


async def test_events_of_a_window_share_one_digest_delivery(make: App, providers: Any) -> None:
    """Two events for one recipient in one window: one delivery, sent once with both."""
    ntype = parse_type(
        "post_liked",
        {
            "digest": {"window": "10m"},
            "templates": {
                "push": {
                    "title": "{{ count }} likes: {{ events | map(attribute='by') | join(', ') }}"
                }
            },
        },
    )
    clock = ManualClock(NOON)
    app = await make(ntype, clock=clock)
    first = await app.notify_event("post_liked", ["u1"], {"by": "ana"}, event_id="like-1")
    second = await app.notify_event("post_liked", ["u1"], {"by": "budi"}, event_id="like-2")
    again = await app.notify_event("post_liked", ["u1"], {"by": "ana"}, event_id="like-1")
    [a], [b], [c] = first.deliveries, second.deliveries, again.deliveries
    assert a.delivery_id == b.delivery_id == c.delivery_id
    assert a.digest == b.digest == "post_liked|u1|push|"
    assert a.run_at == NOON + 600  # the window's end
    assert len(await everything(app)) == 1
    clock.advance(600)
    await app.worker().run(burst=True)
    [sent] = providers["push"].requests
    assert sent.payload["title"] == "2 likes: ana, budi"
    assert sent.payload["events"] == ["like-1", "like-2"]


# -- the sync wrapper and the application's own transaction -----------------------------


def test_sync_kirim_notifies_an_event(tmp_path) -> None:
    """SyncKirim.notify_event and render, for code without an event loop."""
    config = Config(database=f"sqlite:///{tmp_path / 'k.db'}")
    channels = {"push": Channel(name="push", provider=FlakyProvider())}
    ntype = parse_type("hello", {"templates": {"push": {"title": "Hi {{ name }}"}}})
    with SyncKirim(config, channels=channels, types=[ntype]).open(migrate=True) as app:
        assert app.render("hello", {"name": "Ana"}) == {
            "push": {"type": "hello", "locale": "en", "title": "Hi Ana"}
        }
        result = app.notify_event("hello", ["u1"], {"name": "Ana"}, event_id="e-1")
        assert [d.created for d in result.deliveries] == [True]
        record = app.get(result.deliveries[0].delivery_id, by="id")
        assert record is not None
        assert record.delivery.payload["title"] == "Hi Ana"


async def test_notify_event_commits_with_the_business_write(
    request: pytest.FixtureRequest, providers: dict[str, FlakyProvider]
) -> None:
    """PostgreSQL: the event's deliveries exist iff the caller's transaction commits."""
    import psycopg

    from pg import fresh_database

    url = fresh_database(request)
    async with _apps(url, providers) as build:
        app = await build()
        async with await psycopg.AsyncConnection.connect(url) as conn:
            with pytest.raises(RuntimeError, match="no"):  # noqa: PT012
                async with conn.transaction():
                    await app.notify_event(
                        "order_shipped", ["u1"], DATA, event_id="e-1", connection=conn
                    )
                    raise RuntimeError("no")
            assert await everything(app) == []
            async with conn.transaction():
                await app.notify_event(
                    "order_shipped", ["u1", "u2"], DATA, event_id="e-2", connection=conn
                )
        assert len(await everything(app)) == 4


async def test_render_previews_without_the_store(make: App) -> None:
    """Kirim.render: the payloads, per channel or one, in a locale."""
    app = await make()
    assert app.render("order_shipped", DATA, locale="id", channel="email")["email"]["subject"] == (
        "Pesanan 48291 telah dikirim"
    )
    assert set(app.render("order_shipped", DATA)) == {"email", "push"}
