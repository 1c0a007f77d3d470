"""The limits of ``kirim.limits`` on both backends: a value of exactly its limit in
bytes is kept, one byte past it is refused naming its field (422 from the API), and
what a provider answers is cut to its limit before it is stored, never costing the
delivery its truth. Values are random CJK text (3 bytes a character, incompressible),
so that PostgreSQL's B-tree cannot hold them by compressing."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from http_kit import Api, api_on
from kirim import limits
from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.errors import InvalidNotification
from kirim.keys import canonical_json, payload_hash
from kirim.model import DeliveryStatus, OnUnknown
from kirim.notify import parse_type
from kirim.preferences import Preferences
from kirim.providers.base import Message, Sent
from kirim.store.base import NewDelivery
from kirim.testing import FlakyProvider, ManualClock
from kirim.validation import BadValue

TYPES = {
    "plain": {"templates": {"email": {"body": "hi"}}},
    "digested": {
        "templates": {"email": {"body": "{{ count }}"}},
        "digest": {"window": "10m", "key": "group"},
    },
    "throttled": {
        "templates": {"email": {"body": "hi"}},
        "throttle": {"limit": 5, "window": "1h", "per": "key", "key": "group"},
    },
}


def sized(size: int, seed: int = 0) -> str:
    """Random CJK text of exactly ``size`` bytes of UTF-8 (ASCII for what is left)."""
    rng = random.Random(seed * 7919 + size)
    text = "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(size // 3))
    return text + "abc"[: size % 3]


class LongIds:
    """A provider that accepts everything and answers with a message id of its own size."""

    idempotent = False

    def __init__(self, size: int) -> None:
        self.size = size
        self.requests = 0

    async def send(self, message: Message) -> Sent:
        self.requests += 1
        return Sent(provider_message_id=sized(self.size, self.requests))


async def app_on(url: str, provider: Any = None, **channel: Any) -> Kirim:
    kirim = Kirim(
        Config(database=url),
        channels={"email": Channel(name="email", provider=provider or FlakyProvider(), **channel)},
        clock=ManualClock(),
        types=[parse_type(name, spec) for name, spec in TYPES.items()],
    )
    return await kirim.open(migrate=True)


@pytest.fixture
async def app(database_url: str) -> AsyncIterator[Kirim]:
    kirim = await app_on(database_url)
    try:
        yield kirim
    finally:
        await kirim.close()


def test_every_index_holds_its_worst_entry() -> None:
    """The texts each PostgreSQL index holds add up, at their limits, to less than the
    B-tree's largest entry (with room for the entry's headers)."""
    for index, size in limits.INDEXES.items():
        assert size + limits.ENTRY_OVERHEAD <= limits.BTREE_ENTRY, index


# -- notify() and notify_event() -------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "limit"), [("event_id", limits.EVENT_ID), ("recipient", limits.RECIPIENT)]
)
async def test_notify_keeps_a_field_at_its_limit_and_refuses_one_byte_more(
    app: Kirim, field: str, limit: limits.Limit
) -> None:
    """event_id and recipient of notify(): N bytes kept as given, N + 1 refused by name."""
    fields = {"event_id": "e", "recipient": "r", "channel": "email", "payload": {}}
    at = sized(limit.bytes)
    done = await app.notify(**{**fields, field: at})
    record = await app.get(done.delivery_id, by="id")
    assert record is not None
    assert getattr(record.delivery, field) == at
    with pytest.raises(InvalidNotification, match=f"{field} must be at most {limit.bytes} bytes"):
        await app.notify(**{**fields, field: sized(limit.bytes + 1)})


async def test_an_events_id_at_its_limit_is_kept_and_one_byte_more_refused(app: Kirim) -> None:
    """notify_event's event_id, through a digest (its events' unique index) and a throttle."""
    at = sized(limits.EVENT_ID.bytes)
    for name in ("plain", "digested", "throttled"):
        result = await app.notify_event(name, [f"u-{name}"], {"group": "g"}, event_id=at)
        assert result.event_id == at
    with pytest.raises(InvalidNotification, match="event_id must be at most 1024 bytes"):
        await app.notify_event("plain", ["u1"], {}, event_id=sized(limits.EVENT_ID.bytes + 1))


@pytest.mark.parametrize("name", ["digested", "throttled"])
async def test_a_grouping_value_at_its_limit_is_kept_and_one_byte_more_refused(
    app: Kirim, name: str
) -> None:
    """The data field a digest or a throttle groups by: N bytes recorded, N + 1 refused
    naming data.group (PostgreSQL answered SQLSTATE 54000)."""
    at = sized(limits.GROUP.bytes)
    rid = sized(limits.RECIPIENT_ID.bytes, 1)
    result = await app.notify_event(name, [rid], {"group": at}, event_id="e-at")
    assert [d.created for d in result.deliveries] == [True]
    with pytest.raises(InvalidNotification, match=r"data\.group must be at most 255 bytes"):
        await app.notify_event(
            name, [rid], {"group": sized(limits.GROUP.bytes + 1)}, event_id="e-past"
        )


async def test_a_stream_past_its_limit_is_refused_by_name(app: Kirim) -> None:
    """A recipient id and a grouping value within their limits whose escaped stream is
    over STREAM (each '|' and '%' is written in 3 bytes) are refused, naming data.group."""
    with pytest.raises(InvalidNotification, match=r"data\.group"):
        await app.notify_event("digested", ["|" * 255], {"group": "%" * 255}, event_id="e")


async def test_a_recipient_id_at_its_limit_is_kept_and_one_byte_more_refused(app: Kirim) -> None:
    """Recipient ids of events and of preferences: N bytes kept, N + 1 refused."""
    at = sized(limits.RECIPIENT_ID.bytes)
    await app.notify_event("throttled", [at], {"group": "g"}, event_id="e")
    stored = await app.set_preferences(Preferences(recipient_id=at, opt_out=True))
    assert stored.recipient_id == at
    past = sized(limits.RECIPIENT_ID.bytes + 1)
    with pytest.raises(InvalidNotification, match=r"recipients\[0\]\.id must be at most 255"):
        await app.notify_event("plain", [past], {}, event_id="e2")
    with pytest.raises(BadValue, match="recipient_id must be at most 255 bytes"):
        await app.set_preferences(Preferences(recipient_id=past))


async def test_a_callbacks_message_id_at_its_limit_is_kept_and_one_byte_more_refused(
    app: Kirim,
) -> None:
    """Kirim.confirm: a message id of N bytes is looked up and recorded, N + 1 refused."""
    at = sized(limits.MESSAGE_ID.bytes)
    result = await app.confirm("email", at, "delivered")
    assert str(result.outcome) == "unknown"
    with pytest.raises(InvalidNotification, match="message_id must be at most 1000 bytes"):
        await app.confirm("email", sized(limits.MESSAGE_ID.bytes + 1), "delivered")


# -- the provider seam -----------------------------------------------------------------


@pytest.mark.parametrize("size", [limits.MESSAGE_ID.bytes, 6000])
async def test_a_providers_long_message_id_is_kept_within_its_limit(
    database_url: str, size: int
) -> None:
    """A provider answering 200 with a message id of any length: the delivery is sent
    with that id (cut to the limit past it), one request, on a retry channel too."""
    provider = LongIds(size)
    app = await app_on(database_url, provider, on_unknown=OnUnknown.RETRY)
    try:
        done = await app.notify("e", "r", "email", {})
        await app.worker(worker_id="w").run_once()
        record = await app.get(done.delivery_id, by="id")
        assert record is not None
        delivery, attempts = record.delivery, record.attempts
        assert delivery.status is DeliveryStatus.SENT
        assert delivery.doubt is None
        assert provider.requests == 1
        sent = sized(size, 1)
        kept = delivery.provider_message_id
        assert kept is not None
        assert limits.utf8_size(kept) <= limits.MESSAGE_ID.bytes
        assert kept == sent if size <= limits.MESSAGE_ID.bytes else sent.startswith(kept[:-1])
        assert [a.provider_message_id for a in attempts] == [kept]
    finally:
        await app.close()


# -- the HTTP API ----------------------------------------------------------------------


@pytest.fixture
async def api(app: Kirim) -> AsyncIterator[Api]:
    async with api_on(app) as found:
        yield found


def fields_of(response: Any) -> list[str]:
    return [d["field"] for d in response.json()["error"]["details"]]


async def test_the_api_keeps_an_event_id_at_its_limit_and_refuses_one_byte_more(api: Api) -> None:
    """POST /v1/notifications and /v1/events: N bytes 201, N + 1 a 422 naming
    body.event_id (PostgreSQL answered 503 'try again' with Retry-After)."""
    at, past = sized(limits.EVENT_ID.bytes), sized(limits.EVENT_ID.bytes + 1)
    note = {"recipient": "r", "channel": "email", "payload": {}}
    event = {"type": "digested", "recipients": ["u1"], "data": {"group": "g"}}
    for path, body in (("/v1/notifications", note), ("/v1/events", event)):
        ok = await api.client.post(path, json={**body, "event_id": at})
        assert ok.status_code == 201, ok.text
        refused = await api.client.post(path, json={**body, "event_id": past})
        assert refused.status_code == 422, refused.text
        assert fields_of(refused) == ["body.event_id"]


async def test_the_api_refuses_a_grouping_value_one_byte_past_its_limit(api: Api) -> None:
    """POST /v1/events with a digest's group field over its limit: 422 naming body.data."""
    event = {"type": "digested", "recipients": ["u1"], "event_id": "e"}
    at = await api.client.post(
        "/v1/events", json={**event, "data": {"group": sized(limits.GROUP.bytes)}}
    )
    assert at.status_code == 201, at.text
    past = await api.client.post(
        "/v1/events",
        json={**event, "event_id": "e2", "data": {"group": sized(limits.GROUP.bytes + 1)}},
    )
    assert past.status_code == 422, past.text
    assert fields_of(past) == ["body.data"]


async def test_the_api_keeps_a_recipient_id_at_its_limit_and_refuses_one_byte_more(
    api: Api,
) -> None:
    """PUT /v1/recipients/{id}/preferences: an id of N bytes 200, N + 1 a 422."""
    path = "/v1/recipients/{}/preferences"
    ok = await api.client.put(path.format(sized(limits.RECIPIENT_ID.bytes)), json={})
    assert ok.status_code == 200, ok.text
    past = await api.client.put(path.format(sized(limits.RECIPIENT_ID.bytes + 1)), json={})
    assert past.status_code == 422, past.text


@pytest.mark.parametrize(
    ("field", "limit"),
    [
        ("event_id", limits.EVENT_ID),
        ("recipient", limits.RECIPIENT),
        ("recipient_id", limits.RECIPIENT_ID),
    ],
)
async def test_the_store_refuses_a_delivery_built_by_hand_past_a_limit(
    app: Kirim, field: str, limit: limits.Limit
) -> None:
    """The store's intake is the last guard: a NewDelivery over a limit (never through
    notify()) is refused naming the field on both backends, before any index sees it."""
    text = canonical_json({})
    item = NewDelivery(
        idempotency_key="k-1",
        event_id="e",
        recipient="r",
        channel="email",
        payload_json=text,
        payload_hash=payload_hash(text),
        run_at=None,
        max_attempts=3,
    )
    at = await app.store.enqueue([replace(item, **{field: sized(limit.bytes)})], now=1.0)
    assert at[0].created
    past = replace(item, idempotency_key="k-2", **{field: sized(limit.bytes + 1)})
    with pytest.raises(InvalidNotification, match=f"{field} must be at most {limit.bytes}"):
        await app.store.enqueue([past], now=1.0)
    assert (await app.store.get_delivery("k-2", by="key")) is None
