"""``POST /v1/events`` on both backends: one event fanned out, with the Idempotency-Key
semantics of ``/v1/notifications`` (replay, 409 in progress, 422 another body)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from http_kit import Api, api_on
from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.model import DeliveryStatus
from kirim.notify import parse_type
from kirim.preferences import Preferences
from kirim.store.base import RequestBegin
from kirim.testing import FlakyProvider, ManualClock

SHIPPED = {
    "templates": {
        "email": {"subject": "Order {{ order_id }} shipped", "body": "Hi {{ name }}"},
        "push": {"title": "Shipped {{ order_id }}"},
    }
}
EVENT = {
    "type": "order_shipped",
    "event_id": "order-48291-shipped",
    "recipients": ["u-1", {"id": "u-2", "locale": "id", "to": {"email": "b@example.com"}}],
    "data": {"order_id": "48291", "name": "Ana"},
}


@pytest.fixture
async def api(database_url: str) -> AsyncIterator[Api]:
    channels = {n: Channel(name=n, provider=FlakyProvider()) for n in ("email", "push")}
    kirim = Kirim(
        Config(database=database_url),
        channels=channels,
        clock=ManualClock(),
        types=[parse_type("order_shipped", SHIPPED)],
    )
    await kirim.open(migrate=True)
    try:
        async with api_on(kirim) as found:
            yield found
    finally:
        await kirim.close()


async def post(api: Api, body: Any, key: str | None = None) -> Any:
    headers = {} if key is None else {"Idempotency-Key": key}
    return await api.client.post("/v1/events", json=body, headers=headers)


async def deliveries(api: Api) -> list[Any]:
    return sorted((r[0] for r in (await api.kirim.records(limit=100)).records), key=lambda d: d.id)


async def test_an_event_makes_one_delivery_per_recipient_and_channel(api: Api) -> None:
    response = await post(api, EVENT)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["type"] == "order_shipped"
    assert body["event_id"] == "order-48291-shipped"
    pairs = [(d["recipient_id"], d["channel"], d["created"]) for d in body["deliveries"]]
    assert sorted(pairs) == [
        ("u-1", "email", True),
        ("u-1", "push", True),
        ("u-2", "email", True),
        ("u-2", "push", True),
    ]
    stored = await deliveries(api)
    assert len(stored) == 4
    email_2 = next(d for d in stored if d.recipient_id == "u-2" and d.channel == "email")
    assert email_2.recipient == "b@example.com"
    assert email_2.payload["subject"] == "Order 48291 shipped"
    assert {d.type for d in stored} == {"order_shipped"}


async def test_the_same_key_replays_the_first_answer(api: Api) -> None:
    first = await post(api, EVENT, key="k-1")
    again = await post(api, EVENT, key="k-1")
    assert again.status_code == first.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert len(await deliveries(api)) == 4


async def test_without_a_key_the_event_id_is_the_key(api: Api) -> None:
    """No header: the type and event id are the request's key, so a resend replays."""
    first = await post(api, EVENT)
    again = await post(api, EVENT)
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json() == first.json()


async def test_the_same_event_under_another_key_makes_nothing_twice(api: Api) -> None:
    await post(api, EVENT, key="k-1")
    other = await post(api, EVENT, key="k-2")
    assert other.status_code == 200, other.text
    assert "Idempotent-Replayed" not in other.headers
    assert {d["created"] for d in other.json()["deliveries"]} == {False}
    assert len(await deliveries(api)) == 4


async def test_the_header_is_the_event_id_when_the_body_has_none(api: Api) -> None:
    body = {k: v for k, v in EVENT.items() if k != "event_id"}
    response = await post(api, body, key="evt-7")
    assert response.status_code == 201, response.text
    assert response.json()["event_id"] == "evt-7"
    missing = await post(api, body)
    assert missing.status_code == 422
    assert missing.json()["error"]["details"][0]["field"] == "body.event_id"


async def test_another_body_under_the_key_is_refused(api: Api) -> None:
    await post(api, EVENT, key="k-1")
    changed = {**EVENT, "data": {"order_id": "1", "name": "Bo"}}
    response = await post(api, changed, key="k-1")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "idempotency_key_reused"
    assert len(await deliveries(api)) == 4


async def test_the_same_event_id_with_other_data_is_refused(api: Api) -> None:
    """Another key, the same event id, other data: its deliveries' keys name other
    payloads, so it is refused and the request's key is given back."""
    await post(api, EVENT, key="k-1")
    changed = {**EVENT, "data": {"order_id": "1", "name": "Bo"}}
    response = await post(api, changed, key="k-2")
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "idempotency_key_reused"
    assert response.json()["error"]["details"][0]["field"] == "body.data"
    fixed = await post(api, {**EVENT, "event_id": "other"}, key="k-2")
    assert fixed.status_code == 201, fixed.text


async def test_a_key_in_progress_is_409(api: Api) -> None:
    """A request that holds the key (taken here, as a server that has not answered
    yet would) makes the next one wait: 409, nothing written."""
    from kirim.http.events import fingerprint

    begin = RequestBegin(idempotency_key="k-1", fingerprint=fingerprint(EVENT), lock_token="t")
    kirim = api.kirim
    await kirim.store.handle_requests(
        [begin], [], now=kirim.clock.now(), hold=10.0, respond=lambda _: None
    )
    response = await post(api, EVENT, key="k-1")
    assert response.status_code == 409
    assert response.headers["Retry-After"] == "1"
    assert await deliveries(api) == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"type": "nope"}, None),
        ({"recipients": []}, "body.recipients"),
        ({"data": {"name": "no order id"}}, None),
        ({"data": [1]}, "body.data"),
        ({"extra": 1}, "body.extra"),
    ],
)
async def test_bad_events_are_422_and_write_nothing(
    api: Api, change: dict[str, Any], field: str | None
) -> None:
    response = await post(api, {**EVENT, **change})
    assert response.status_code == 422, response.text
    if field is not None:
        assert response.json()["error"]["details"][0]["field"] == field
    assert await deliveries(api) == []
    # the key was not taken: the right event goes through under it at once
    assert (await post(api, EVENT)).status_code == 201


async def test_a_missing_variable_names_it(api: Api) -> None:
    response = await post(api, {**EVENT, "data": {"name": "Ana"}})
    assert response.status_code == 422
    assert "order_id" in response.json()["error"]["message"]


async def test_preferences_suppress_with_their_reason(api: Api) -> None:
    await api.kirim.set_preferences(Preferences(recipient_id="u-1", opt_out=True))
    response = await post(api, EVENT)
    assert response.status_code == 201
    by = {(d["recipient_id"], d["channel"]): d for d in response.json()["deliveries"]}
    assert by["u-1", "email"]["status"] == DeliveryStatus.SUPPRESSED
    assert by["u-1", "email"]["reason"] == "opted_out"
    assert by["u-2", "email"]["status"] == DeliveryStatus.PENDING
    assert by["u-2", "email"]["reason"] is None


async def test_an_event_is_bounded_in_what_it_renders_in_all(api: Api) -> None:
    """One valid request whose data is copied into every recipient's payload renders at
    most MAX_EVENT_BYTES in all (413 naming body.data, nothing written); the issue's
    258 KB request for 1,000 recipients wrote 500 MB and stalled every other client."""
    from kirim.notify.fanout import MAX_EVENT_BYTES

    recipients = [f"u-{i}" for i in range(300)]
    name = "x" * 16000  # 300 recipients' emails of 16 kB: past 4 MiB
    big = {**EVENT, "recipients": recipients, "data": {"order_id": "1", "name": name}}
    response = await post(api, big)
    assert response.status_code == 413, response.status_code
    assert response.json()["error"]["code"] == "payload_too_large"
    assert [d["field"] for d in response.json()["error"]["details"]] == ["body.data"]
    assert str(MAX_EVENT_BYTES) in response.json()["error"]["message"]
    assert await deliveries(api) == []
    small = {**big, "recipients": recipients[:100]}  # within the bound: recorded
    assert (await post(api, small)).status_code == 201


async def test_a_replay_answers_its_response_after_the_config_changed(
    database_url: str, api: Api
) -> None:
    """A completed event replays its first response after its template gained a
    variable the body lacks (it got 422) or one of its channels was removed
    (unknown_channel): the key is looked up before today's configuration."""
    first = await post(api, EVENT, key="k-1")
    plain = await post(api, {**EVENT, "event_id": "order-2"})
    assert first.status_code == plain.status_code == 201
    changed = {
        "templates": {
            "email": {"subject": "Order {{ order_id }} shipped to {{ city }}", "body": "x"},
            "push": {"title": "Shipped {{ order_id }}"},
        }
    }
    for channels, spec in (
        (("email", "push"), changed),
        (("email",), {"templates": {"email": {"body": "b"}, "push": {"title": "t"}}}),
    ):
        kirim = Kirim(
            Config(database=database_url),
            channels={n: Channel(name=n, provider=FlakyProvider()) for n in channels},
            clock=ManualClock(),
            types=[parse_type("order_shipped", spec)],
        )
        await kirim.open()
        try:
            async with api_on(kirim, name=f"later-{len(channels)}") as later:
                again = await post(later, EVENT, key="k-1")
                assert again.status_code == 201, again.text
                assert again.headers["Idempotent-Replayed"] == "true"
                assert again.json() == first.json()
                replayed = await post(later, {**EVENT, "event_id": "order-2"})
                assert replayed.status_code == 201, replayed.text
                assert replayed.json() == plain.json()
                fresh = await post(later, {**EVENT, "event_id": "order-3"})
                assert fresh.status_code == 422, fresh.text
        finally:
            await kirim.close()


@pytest.mark.parametrize(
    "source",
    [
        "{{ total | number }}",
        "{{ total | currency('IDR') }}",
        "{{ shipped_at | date('long') }}",
        "{{ 5 | currency(code) }}",
        "{{ total | round | number }}",
    ],
)
async def test_a_missing_variable_is_named_through_a_filter(database_url: str, source: str) -> None:
    """A variable the data lacks, given to a filter, is a 422 that names it, in the
    message and in details (body.data.NAME); it was 'ValueError: Undefined is not a
    number' with empty details."""
    name = source.split("{{ ")[1].split(" ")[0] if "code" not in source else "code"
    kirim = Kirim(
        Config(database=database_url),
        channels={"email": Channel(name="email", provider=FlakyProvider())},
        clock=ManualClock(),
        types=[parse_type("receipt", {"templates": {"email": {"body": source}}})],
    )
    await kirim.open(migrate=True)
    try:
        async with api_on(kirim) as client:
            body = {"type": "receipt", "event_id": "e1", "recipients": ["u1"], "data": {}}
            response = await post(client, body)
    finally:
        await kirim.close()
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert f"'{name}' is undefined" in error["message"]
    assert "Undefined is not" not in error["message"]
    assert [(d["field"], d["type"]) for d in error["details"]] == [(f"body.data.{name}", "missing")]


async def test_an_event_with_a_number_json_cannot_keep_is_a_422(api: Api) -> None:
    """Data holding 1e999 is a 422 naming body.data, never a 500."""
    raw = (
        b'{"type": "order_shipped", "event_id": "e-inf", "recipients": ["u-1"], '
        b'"data": {"order_id": 1e999, "name": "a"}}'
    )
    answer = await api.client.post(
        "/v1/events", content=raw, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 422, answer.text
    assert [d["field"] for d in answer.json()["error"]["details"]] == ["body.data"]
