"""``/v1/topics`` on both backends: subscribe, list, page, events to a topic."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from http_kit import Api, api_on
from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.notify import parse_type
from kirim.testing import FlakyProvider, ManualClock

NEWS = parse_type("news", {"templates": {"push": {"title": "{{ title }}"}}})


@pytest.fixture
async def api(database_url: str, clock: ManualClock) -> AsyncIterator[Api]:
    channels = {"push": Channel(name="push", provider=FlakyProvider())}
    app = Kirim(Config(database=database_url), channels=channels, clock=clock, types=[NEWS])
    await app.open(migrate=True)
    try:
        async with api_on(app) as found:
            yield found
    finally:
        await app.close()


async def test_subscribe_page_and_unsubscribe(api: Api) -> None:
    """PUT subscribes (201, then 200); GET pages the subscribers; DELETE ends one (204,
    then 404)."""
    first = await api.client.put("/v1/topics/project:42/subscribers/u-1")
    assert first.status_code == 201, first.text
    assert first.json()["created"] is True
    again = await api.client.put("/v1/topics/project:42/subscribers/u-1")
    assert again.status_code == 200
    await api.client.put("/v1/topics/project:42/subscribers/u-2")
    page = await api.client.get("/v1/topics/project:42/subscribers", params={"limit": 1})
    assert page.json() == {"topic": "project:42", "subscribers": ["u-1"], "next": "u-1"}
    rest = await api.client.get("/v1/topics/project:42/subscribers", params={"after": "u-1"})
    assert rest.json()["subscribers"] == ["u-2"]
    assert rest.json()["next"] is None
    listed = await api.client.get("/v1/topics")
    assert [(t["topic"], t["subscribers"]) for t in listed.json()["topics"]] == [("project:42", 2)]
    gone = await api.client.delete("/v1/topics/project:42/subscribers/u-2")
    assert gone.status_code == 204
    assert (await api.client.delete("/v1/topics/project:42/subscribers/u-2")).status_code == 404


async def test_an_event_to_a_topic_is_recorded_once(api: Api) -> None:
    """POST .../events answers 202 with the event, 200 with the same one when given
    again; GET /v1/topics/{topic} shows it among the latest fan-outs."""
    await api.client.put("/v1/topics/p/subscribers/u-1")
    body = {"type": "news", "event_id": "e-1", "data": {"title": "hi"}}
    made = await api.client.post("/v1/topics/p/events", json=body)
    assert made.status_code == 202, made.text
    assert made.json()["status"] == "expanding"
    again = await api.client.post("/v1/topics/p/events", json=body)
    assert again.status_code == 200
    assert again.json()["id"] == made.json()["id"]
    shown = await api.client.get("/v1/topics/p")
    assert [e["event_id"] for e in shown.json()["recent"]] == ["e-1"]
    assert (await api.client.get("/v1/topics/nobody")).status_code == 404


async def test_a_bad_topic_event_is_refused_with_nothing_recorded(api: Api) -> None:
    """An unknown type, a missing variable or another body shape: 422, nothing kept."""
    for body in (
        {"type": "nope", "event_id": "e", "data": {}},
        {"type": "news", "event_id": "e", "data": {}},
        {"type": "news", "event_id": "e", "data": []},
        {"type": "news", "event_id": "e", "extra": 1},
    ):
        refused = await api.client.post("/v1/topics/p/events", json=body)
        assert refused.status_code == 422, (body, refused.text)
    assert (await api.client.get("/v1/topics/p")).status_code == 404


async def test_the_topic_routes_need_the_token(api: Api) -> None:
    """Without a valid bearer token the topic routes answer 401."""
    wrong = {"Authorization": "Bearer " + "0" * 40}
    for method, path in (
        ("GET", "/v1/topics"),
        ("PUT", "/v1/topics/p/subscribers/u-1"),
        ("POST", "/v1/topics/p/events"),
    ):
        answer = await api.client.request(method, path, headers=wrong)
        assert answer.status_code == 401, path
