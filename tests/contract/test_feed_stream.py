"""``GET /v1/recipients/{id}/feed/stream`` on both backends, served by a real uvicorn on
127.0.0.1 and read with httpx's streaming: a new message arrives on an open stream;
``Last-Event-ID`` resumes with nothing missed and nothing repeated; a change made
through a second app (its own Kirim, its own connections, as another ``kirim serve``)
reaches the first's streams (PostgreSQL: LISTEN/NOTIFY; SQLite: the counter's poll).
Every wait is for an event, bounded by a timeout that only fails the test."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from http_kit import served
from kirim.channels import Channel
from kirim.config import Config, InboxSettings
from kirim.engine import Kirim
from kirim.http import create_app
from kirim.providers.inbox import InboxProvider
from kirim.worker import WorkerSettings

SECRET = "s3cret-for-the-stream-tests-0123456789"
#: a bound on every wait: only a broken stream reaches it
BOUND = 20.0


@dataclass
class Event:
    event: str
    id: int
    data: Any


def _kirim(database_url: str) -> Kirim:
    config = Config(database=database_url, inbox=InboxSettings(secret=SECRET))
    return Kirim(config, channels={"inbox": Channel(name="inbox", provider=InboxProvider())})


async def deliver(app: Kirim, rid: str, *titles: str) -> None:
    """Notify ``rid`` once per title, and let a worker write them into the feed."""
    for title in titles:
        await app.notify(f"{rid}-{title}", rid, "inbox", {"title": title})
    worker = app.worker(settings=WorkerSettings(lease=30.0))
    while await worker.run_once():
        pass


class Stream:
    """One open stream's events, parsed as a browser's EventSource does."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.comments = 0
        self._lines = response.aiter_lines()

    async def next(self) -> Event:
        fields: dict[str, str] = {}
        async with asyncio.timeout(BOUND):
            async for line in self._lines:
                if line == "":
                    if "data" in fields:
                        data = json.loads(fields["data"])
                        return Event(fields.get("event", "message"), int(fields["id"]), data)
                    fields = {}
                    continue
                if line.startswith(":"):
                    self.comments += 1  # a heartbeat
                    continue
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
        raise AssertionError("the stream ended")

    async def heartbeat(self) -> None:
        """Wait for the next comment line (between events)."""
        async with asyncio.timeout(BOUND):
            async for line in self._lines:
                if line.startswith(":"):
                    self.comments += 1
                    return
                assert line == "", f"an event came before the heartbeat: {line!r}"
        raise AssertionError("the stream ended")

    async def until(self, kind: str) -> list[Event]:
        """The events up to and including the next one of ``kind``."""
        seen = [await self.next()]
        while seen[-1].event != kind:
            seen.append(await self.next())
        return seen


@pytest.fixture
async def first(database_url: str) -> AsyncIterator[tuple[Kirim, str]]:
    """A served app on the database (migrated), and its base URL."""
    setup = _kirim(database_url)
    await setup.open(migrate=True)
    await setup.close()
    app = _kirim(database_url)
    with served(create_app(app)) as base:
        yield app, base


@pytest.fixture
async def writer(database_url: str) -> AsyncIterator[Kirim]:
    """Another Kirim on the same database: another process's worker."""
    app = _kirim(database_url)
    await app.open()
    try:
        yield app
    finally:
        await app.close()


@contextlib.asynccontextmanager
async def stream(
    client: httpx.AsyncClient, base: str, rid: str, token: str, **params: Any
) -> AsyncIterator[Stream]:
    headers = {}
    if "last_event_id_header" in params:
        headers["Last-Event-ID"] = str(params.pop("last_event_id_header"))
    url = f"{base}/v1/recipients/{rid}/feed/stream"
    async with client.stream(
        "GET", url, params={"token": token, **params}, headers=headers
    ) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        yield Stream(response)


def token_for(app: Kirim, rid: str) -> str:
    return app.feed_token(rid, ttl=600)[0]


async def test_a_new_message_arrives_on_an_open_stream(
    first: tuple[Kirim, str], writer: Kirim
) -> None:
    """A stream starts with the counts; a message another process's worker writes
    arrives as a `message` event, then the new counts; a mark made through the API
    arrives as `state`; another recipient's messages never do."""
    _app, base = first
    async with (
        httpx.AsyncClient(timeout=BOUND) as client,
        stream(client, base, "u1", token_for(writer, "u1")) as s,
    ):
        opened = await s.next()
        assert (opened.event, opened.data) == ("counts", {"unseen": 0, "unread": 0})
        await deliver(writer, "u2", "not yours")
        await deliver(writer, "u1", "hello")
        got = await s.until("counts")
        assert [e.event for e in got] == ["message", "counts"]
        assert got[0].data["title"] == "hello"
        assert got[0].data["read_at"] is None
        assert got[0].id > opened.id
        assert got[1].data == {"unseen": 1, "unread": 1}
        item = got[0].data["id"]
        marked = await client.post(
            f"{base}/v1/recipients/u1/feed/{item}/read",
            headers={"Authorization": f"Bearer {token_for(writer, 'u1')}"},
        )
        assert marked.status_code == 200
        changed = await s.until("counts")
        assert [e.event for e in changed] == ["state", "counts"]
        assert changed[0].data["read_at"] is not None
        assert changed[1].data == {"unseen": 0, "unread": 0}
        assert changed[0].id > got[0].id


async def test_last_event_id_resumes_with_nothing_missed_nor_repeated(
    first: tuple[Kirim, str], writer: Kirim
) -> None:
    """Reconnecting with the last id it had, a client is sent what changed while it was
    away, once, in order (a message made and deleted meanwhile not at all); once more
    from the newest id, nothing but the counts."""
    _, base = first
    await deliver(writer, "u1", "before")
    token = token_for(writer, "u1")
    async with httpx.AsyncClient(timeout=BOUND) as client:
        async with stream(client, base, "u1", token) as s:
            last = (await s.next()).id
        before = (await writer.feed("u1")).items[0]
        await deliver(writer, "u1", "one", "two", "gone")
        page = {i.title: i.id for i in (await writer.feed("u1")).items}
        await writer.feed_action("u1", before.id, "read")
        await writer.delete_feed_item("u1", page["gone"])
        async with stream(client, base, "u1", token, last_event_id_header=last) as s:
            got = await s.until("counts")
        assert [(e.event, e.data.get("title")) for e in got] == [
            ("message", "one"),
            ("message", "two"),
            ("state", "before"),
            ("counts", None),
        ]
        ids = [e.id for e in got]
        assert ids == sorted(ids)
        assert len(set(ids[:-1])) == 3
        assert got[-1].data == {"unseen": 2, "unread": 2}
        async with stream(client, base, "u1", token, last_event_id=got[-1].id) as s:
            again = await s.next()
            assert again.event == "counts"
            assert again.id == got[-1].id
            await writer.mark_feed("u1", "seen")
            marked = await s.until("counts")
            assert {e.data["title"] for e in marked[:-1]} == {"one", "two"}
            assert all(e.event == "state" for e in marked[:-1])


async def test_a_change_through_a_second_app_reaches_the_first(
    database_url: str, first: tuple[Kirim, str]
) -> None:
    """Two served apps on one database: a message written and marked through the
    second's API and worker reaches the stream open on the first."""
    _, base = first
    second = _kirim(database_url)
    with served(create_app(second)) as other:
        async with httpx.AsyncClient(timeout=BOUND) as client:
            token = second.feed_token("u1", ttl=600)[0]
            async with stream(client, base, "u1", token) as s:
                await s.next()
                await client.get(f"{other}/v1/recipients/u1/feed/counts", params={"token": token})
                worker = _kirim(database_url)
                await worker.open()
                try:
                    await deliver(worker, "u1", "from afar")
                finally:
                    await worker.close()
                got = await s.until("counts")
                assert got[0].event == "message"
                assert got[0].data["title"] == "from afar"
                marked = await client.post(
                    f"{other}/v1/recipients/u1/feed/mark",
                    json={"ids": None, "state": "read"},
                    params={"token": token},
                )
                assert marked.json() == {"changed": 1}
                changed = await s.until("counts")
                assert changed[0].event == "state"
                assert changed[0].data["read_at"] is not None


async def test_a_feed_token_of_another_recipient_is_refused(first: tuple[Kirim, str]) -> None:
    """A stream needs a token of its own recipient: another's is 403, none is 401."""
    app, base = first
    async with httpx.AsyncClient(timeout=BOUND) as client:
        url = f"{base}/v1/recipients/u1/feed/stream"
        other = await client.get(url, params={"token": token_for(app, "u2")})
        assert other.status_code == 403
        assert (await client.get(url)).status_code == 401


async def test_a_stream_ends_when_its_feed_token_expires(first: tuple[Kirim, str]) -> None:
    """A stream of a feed token ends at the token's expiry (the page must come back with
    a new one); the same expired token is then refused."""
    app, base = first
    token = app.feed_token("u1", ttl=2)[0]  # expires in 1 to 2 seconds (whole seconds)
    async with httpx.AsyncClient(timeout=BOUND) as client:
        async with stream(client, base, "u1", token) as s:
            assert (await s.next()).event == "counts"
            with pytest.raises(AssertionError, match="the stream ended"):
                await s.next()
        url = f"{base}/v1/recipients/u1/feed/stream"
        assert (await client.get(url, params={"token": token})).status_code == 401


async def test_the_element_is_served_to_any_page(first: tuple[Kirim, str]) -> None:
    """/static/kirim-inbox.js is JavaScript any origin may load as a module (CORS *)."""
    _, base = first
    async with httpx.AsyncClient(timeout=BOUND) as client:
        got = await client.get(f"{base}/static/kirim-inbox.js")
    assert got.status_code == 200
    assert got.headers["content-type"].startswith("text/javascript")
    assert got.headers["access-control-allow-origin"] == "*"
    assert 'customElements.define("kirim-inbox"' in got.text


async def test_a_quiet_stream_gets_heartbeats(
    first: tuple[Kirim, str], writer: Kirim, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream with nothing to say sends comments (here every 0.1 s, 15 s by default),
    which an EventSource ignores; the next event still comes after them."""
    from kirim.http import routes_feed_stream

    monkeypatch.setattr(routes_feed_stream, "HEARTBEAT", 0.1)
    _, base = first
    async with (
        httpx.AsyncClient(timeout=BOUND) as client,
        stream(client, base, "u1", token_for(writer, "u1")) as s,
    ):
        await s.next()
        await s.heartbeat()
        await s.heartbeat()
        await deliver(writer, "u1", "after a quiet while")
        assert (await s.until("counts"))[0].data["title"] == "after a quiet while"
