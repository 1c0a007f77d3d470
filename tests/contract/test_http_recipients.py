"""``/v1/recipients/{id}/preferences`` on both backends: read, replace, forget, refuse."""

from __future__ import annotations

import pytest

from http_kit import Api, api_on
from kirim.notify.types import parse_type
from kirim.preferences import Preferences
from kirim.views import iso

SHIPPED = parse_type("order_shipped", {"templates": {"push": {"title": "{{ order_id }}"}}})

PREFS = {
    "opt_out": False,
    "channels": {"order_shipped:push": False, "*:push": True},
    "timezone": "Asia/Jakarta",
    "quiet_hours": {"start": "22:00", "end": "07:00"},
}


@pytest.fixture
async def api(make_app):
    app = await make_app()
    app.types = {"order_shipped": SHIPPED}  # the one type these preferences name
    async with api_on(app) as found:
        yield found


def url(recipient_id: str = "u-1") -> str:
    return f"/v1/recipients/{recipient_id}/preferences"


async def test_put_then_get_answers_the_document_as_stored(api: Api, clock) -> None:
    """PUT stores the whole document and answers it; GET answers the same; the engine
    reads what the API wrote."""
    put = await api.client.put(url(), json=PREFS)
    assert put.status_code == 200, put.text
    body = put.json()
    assert body == {
        "recipient_id": "u-1",
        "opt_out": False,
        "channels": {"*:push": True, "order_shipped:push": False},
        "timezone": "Asia/Jakarta",
        "quiet_hours": {"start": "22:00", "end": "07:00"},
        "updated_at": iso(clock.now()),
    }
    got = await api.client.get(url())
    assert got.status_code == 200
    assert got.json() == body
    stored = await api.kirim.preferences("u-1")
    assert stored == Preferences.from_json("u-1", PREFS, updated_at=clock.now())


async def test_put_replaces_every_field(api: Api) -> None:
    """A field left out of a PUT is reset to its default."""
    await api.client.put(url(), json=PREFS)
    again = await api.client.put(url(), json={"opt_out": True})
    assert again.status_code == 200
    body = again.json()
    assert body["opt_out"] is True
    assert body["channels"] == {}
    assert body["timezone"] is None
    assert body["quiet_hours"] is None


@pytest.mark.parametrize(
    ("pattern", "says"),
    [("order_shiped:push", "the type 'order_shiped'"), ("*:sms", "the channel 'sms'")],
)
async def test_put_refuses_a_type_or_channel_that_is_not_configured(
    api: Api, pattern: str, says: str
) -> None:
    """A new preference naming a type or channel that is not configured is a 422 naming
    it, and nothing is stored."""
    put = await api.client.put(url(), json={"channels": {pattern: False}})
    assert put.status_code == 422, put.text
    assert says in put.text
    assert await api.kirim.preferences("u-1") is None


async def test_a_recipient_without_preferences_is_404(api: Api) -> None:
    got = await api.client.get(url("nobody"))
    assert got.status_code == 404
    error = got.json()["error"]
    assert error["code"] == "not_found"
    assert "nobody" in error["message"]
    gone = await api.client.delete(url("nobody"))
    assert gone.status_code == 404


async def test_delete_forgets_them(api: Api) -> None:
    await api.client.put(url(), json=PREFS)
    gone = await api.client.delete(url())
    assert gone.status_code == 204
    assert gone.content == b""
    assert await api.kirim.preferences("u-1") is None
    assert (await api.client.get(url())).status_code == 404


async def test_an_id_with_a_slash_is_addressable_encoded(api: Api) -> None:
    """%2F in the path is part of the id."""
    put = await api.client.put(url("tenant%2Fuser 7"), json={"opt_out": True})
    assert put.status_code == 200, put.text
    assert put.json()["recipient_id"] == "tenant/user 7"
    found = await api.kirim.preferences("tenant/user 7")
    assert found is not None
    assert found.opt_out


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"timezone": "Mars/Olympus"}, "body.timezone"),
        ({"quiet_hours": {"start": "22:00", "end": "7"}}, "body.quiet_hours.end"),
        ({"quiet_hours": {"start": "07:00", "end": "07:00"}}, "body.quiet_hours"),
        ({"channels": {"email": False}}, "body.channels['email']"),
        ({"channels": {"a:b": "off"}}, "body.channels['a:b']"),
        ({"opt_out": 1}, "body.opt_out"),
        ({"opt-out": True}, "body.opt-out"),
        (["opt_out"], "body"),
    ],
)
async def test_a_bad_document_is_422_naming_the_field(api: Api, body: object, field: str) -> None:
    """The error format of the other routes; nothing is stored."""
    put = await api.client.put(url(), json=body)
    assert put.status_code == 422, put.text
    error = put.json()["error"]
    assert error["code"] == "validation_error"
    assert [d["field"] for d in error["details"]] == [field]
    assert await api.kirim.preferences("u-1") is None


async def test_a_blank_id_is_422(api: Api) -> None:
    put = await api.client.put(url("%20%20"), json={})
    assert put.status_code == 422
    assert put.json()["error"]["details"][0]["field"] == "path.recipient_id"


async def test_malformed_json_and_media_type(api: Api) -> None:
    bad = await api.client.put(url(), content=b"{", headers={"Content-Type": "application/json"})
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "malformed_json"
    text = await api.client.put(url(), content=b"{}", headers={"Content-Type": "text/plain"})
    assert text.status_code == 415


async def test_every_route_needs_the_bearer_token(api: Api) -> None:
    """401 without a token, for each method; nothing is stored."""
    headers = {"Authorization": "Bearer nope"}
    for method in ("GET", "PUT", "DELETE"):
        response = await api.client.request(method, url(), json={}, headers=headers)
        assert response.status_code == 401, method
        assert response.json()["error"]["code"] == "unauthorized"
    assert await api.kirim.preferences("u-1") is None


async def test_another_server_sees_a_change(make_app) -> None:
    """Two servers, each on its own connection: a PUT on one is the GET of the other."""
    async with api_on(await make_app()) as one, api_on(await make_app(), name="b") as two:
        await one.client.put(url(), json={"opt_out": True})
        got = await two.client.get(url())
        assert got.status_code == 200
        assert got.json()["opt_out"] is True


async def test_a_suppressed_delivery_shows_its_reason(make_app) -> None:
    """GET /v1/notifications/{id}, the browse page and the notification page say why."""
    from test_preference_check import POLICIES, typed

    from kirim.config import ServeSettings

    app = await make_app()
    d = await typed(app, 1)
    await app.set_preferences(Preferences(recipient_id="u1", opt_out=True))
    await app.store.claim(worker_id="w", now=app.clock.now(), lease=10, limit=5, policies=POLICIES)
    local = ServeSettings(allowed_hosts=("testserver",))
    async with api_on(app, settings=local) as api:
        got = (await api.client.get(f"/v1/notifications/{d.id}")).json()
        assert (got["status"], got["reason"]) == ("suppressed", "opted_out")
        assert (got["type"], got["recipient_id"]) == ("order_shipped", "u1")
        anon = {"Authorization": ""}
        page = await api.client.get("/dashboard/browse?status=suppressed", headers=anon)
        assert page.status_code == 200, page.text
        assert '<span class="reason" data-reason="opted_out">(opted out)</span>' in page.text
        one = await api.client.get(f"/dashboard/notifications/{d.id}", headers=anon)
        assert 'id="reason" data-reason="opted_out">opted out</span>' in one.text
        assert "order_shipped for u1" in one.text
