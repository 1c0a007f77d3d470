"""``/v1/recipients/{id}/feed`` on both backends: the page, counts, marks one by one
and in bulk, delete; feed tokens reach only their recipient's feed (403 for another,
401 forged or expired, in the header or as ``?token=``), never another route; only an
operator token makes them; CORS answers the configured origins on the feed only."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from http_kit import Api, api_on
from kirim.channels import Channel
from kirim.config import Config, InboxSettings
from kirim.engine import Kirim
from kirim.providers.inbox import InboxProvider
from kirim.testing import ManualClock
from kirim.worker import WorkerSettings

SECRET = "s3cret-for-the-tests-only-0123456789"
ORIGIN = "https://app.example"


@pytest.fixture
async def api(database_url: str, clock: ManualClock) -> AsyncIterator[Api]:
    config = Config(
        database=database_url, inbox=InboxSettings(secret=SECRET, allowed_origins=(ORIGIN,))
    )
    channels = {"inbox": Channel(name="inbox", provider=InboxProvider())}
    app = Kirim(config, channels=channels, clock=clock)
    await app.open(migrate=True)
    for rid, n in (("u1", 3), ("u2", 1)):
        for i in range(n):
            await app.notify(f"{rid}-{i}", rid, "inbox", {"title": f"t{i}", "data": {"i": i}})
    worker = app.worker(settings=WorkerSettings(lease=30.0))
    while await worker.run_once():
        pass
    try:
        async with api_on(app) as found:
            yield found
    finally:
        await app.close()


def as_feed(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def feed_token(api: Api, rid: str, ttl: int = 600) -> str:
    made = await api.client.post(f"/v1/recipients/{rid}/feed-token", json={"ttl_seconds": ttl})
    assert made.status_code == 200, made.text
    assert made.json()["expires_at"].endswith("Z")
    token: str = made.json()["token"]
    return token


async def test_the_page_counts_and_marks(api: Api) -> None:
    """The page lists newest first with counts and a cursor; a read keeps its first
    time; mark all read counts what changed; archive hides; delete is 204 then 404."""
    c = api.client
    page = (await c.get("/v1/recipients/u1/feed", params={"limit": 2})).json()
    assert [i["title"] for i in page["items"]] == ["t2", "t1"]
    assert page["counts"] == {"unseen": 3, "unread": 3}
    assert set(page["items"][0]) == {
        *("id", "type", "title", "body", "action_url", "data"),
        *("created_at", "seen_at", "read_at", "archived_at"),
    }
    rest = await c.get("/v1/recipients/u1/feed", params={"before": page["next_before"]})
    assert [i["data"] for i in rest.json()["items"]] == [{"i": 0}]
    assert rest.json()["next_before"] is None
    newest = page["items"][0]["id"]
    read = (await c.post(f"/v1/recipients/u1/feed/{newest}/read")).json()
    assert read["read_at"] is not None
    assert read["seen_at"] == read["read_at"]
    again = (await c.post(f"/v1/recipients/u1/feed/{newest}/read")).json()
    assert again["read_at"] == read["read_at"]
    assert (await c.get("/v1/recipients/u1/feed/counts")).json() == {"unseen": 2, "unread": 2}
    marked = await c.post("/v1/recipients/u1/feed/mark", json={"ids": None, "state": "read"})
    assert marked.json() == {"changed": 2}
    assert (await c.get("/v1/recipients/u2/feed/counts")).json() == {"unseen": 1, "unread": 1}
    archived = await c.post(f"/v1/recipients/u1/feed/{newest}/archive")
    assert archived.json()["archived_at"] is not None
    listed = (await c.get("/v1/recipients/u1/feed", params={"filter": "archived"})).json()
    assert [i["id"] for i in listed["items"]] == [newest]
    assert (await c.delete(f"/v1/recipients/u1/feed/{newest}")).status_code == 204
    assert (await c.delete(f"/v1/recipients/u1/feed/{newest}")).status_code == 404
    bad = await c.post("/v1/recipients/u1/feed/mark", json={"ids": [1], "state": "gone"})
    assert bad.status_code == 422
    assert (await c.get("/v1/recipients/u1/feed", params={"filter": "x"})).status_code == 422


async def test_another_recipients_item_is_404(api: Api) -> None:
    """An item of u2's, asked for under u1, is 404 and stays as it was."""
    [theirs] = (await api.client.get("/v1/recipients/u2/feed")).json()["items"]
    for verb in ("seen", "read", "archive"):
        answer = await api.client.post(f"/v1/recipients/u1/feed/{theirs['id']}/{verb}")
        assert answer.status_code == 404
    assert (await api.client.delete(f"/v1/recipients/u1/feed/{theirs['id']}")).status_code == 404
    [still] = (await api.client.get("/v1/recipients/u2/feed")).json()["items"]
    assert still == theirs


async def test_a_feed_token_reaches_its_own_feed_only(api: Api, clock: ManualClock) -> None:
    """A feed token reads and marks its recipient's feed (header or ?token=); another
    recipient's feed is 403, any other route 403, a forged or expired one 401, and a
    feed token cannot make feed tokens."""
    token = await feed_token(api, "u1", ttl=600)
    c = api.client
    assert (await c.get("/v1/recipients/u1/feed", headers=as_feed(token))).status_code == 200
    bare = httpx.AsyncClient(transport=c._transport, base_url="http://testserver")
    async with bare:
        by_query = await bare.get("/v1/recipients/u1/feed/counts", params={"token": token})
        assert by_query.status_code == 200
        marked = await bare.post(
            "/v1/recipients/u1/feed/mark",
            params={"token": token},
            json={"ids": None, "state": "seen"},
        )
        assert marked.json() == {"changed": 3}
        assert (
            await bare.get("/v1/recipients/u2/feed", params={"token": token})
        ).status_code == 403
        assert (await bare.get("/v1/recipients/u1/feed")).status_code == 401
        operator = await bare.get("/v1/recipients/u1/feed", params={"token": api.token})
        assert operator.status_code == 401  # an operator token only in the header
        for path in ("/v1/notifications", "/v1/recipients/u1/preferences"):
            assert (await bare.get(path, headers=as_feed(token))).status_code == 403
        made = await bare.post(
            "/v1/recipients/u1/feed-token", json={"ttl_seconds": 60}, headers=as_feed(token)
        )
        assert made.status_code == 403
        forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
        assert (
            await bare.get("/v1/recipients/u1/feed", headers=as_feed(forged))
        ).status_code == 401
        clock.advance(601)
        expired = await bare.get("/v1/recipients/u1/feed", headers=as_feed(token))
        assert expired.status_code == 401
        assert "expired" in expired.json()["error"]["message"]


async def test_no_secret_no_feed_token(database_url: str, clock: ManualClock) -> None:
    """Without an [inbox] secret a feed token is not made (409) nor accepted (401)."""
    app = Kirim(Config(database=database_url), channels={}, clock=clock)
    await app.open(migrate=True)
    try:
        async with api_on(app) as api:
            made = await api.client.post("/v1/recipients/u1/feed-token", json={"ttl_seconds": 60})
            assert made.status_code == 409
            other = Kirim(Config(database=database_url, inbox=InboxSettings(secret=SECRET)))
            token, _ = other.feed_token("u1", ttl=60)
            got = await api.client.get("/v1/recipients/u1/feed", headers=as_feed(token))
            assert got.status_code == 401
    finally:
        await app.close()


async def test_cors_answers_the_configured_origin_on_the_feed_only(api: Api) -> None:
    """A preflight from the allowed origin is answered on the feed's paths, with the
    headers a feed page sends; another origin, or another path, gets no CORS grant."""
    ask = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    pre = await api.client.options("/v1/recipients/u1/feed/mark", headers=ask)
    assert pre.status_code == 200
    assert pre.headers["access-control-allow-origin"] == ORIGIN
    other = await api.client.options(
        "/v1/recipients/u1/feed/mark", headers={**ask, "Origin": "https://evil.example"}
    )
    assert other.headers.get("access-control-allow-origin") is None
    got = await api.client.get("/v1/recipients/u1/feed", headers={"Origin": ORIGIN})
    assert got.headers["access-control-allow-origin"] == ORIGIN
    elsewhere = await api.client.get("/v1/notifications", headers={"Origin": ORIGIN})
    assert "access-control-allow-origin" not in elsewhere.headers
