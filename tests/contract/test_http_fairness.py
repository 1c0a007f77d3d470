"""No valid request waits behind another client's one request: while a big event is
provably still being rendered (held at a checkpoint inside its render), a bounded load
of small requests on loopback is answered (both backends, a real server). No timing
is asserted: the small requests complete while the big one has not."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx

from http_kit import served
from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.http import create_app
from kirim.notify import parse_type
from kirim.notify.fanout import Event
from kirim.testing import FlakyProvider
from kirim.tokens import create_token

TYPE = {"templates": {"push": {"title": "{% for i in items %}{{ i }}{% endfor %}"}}}
SMALL_NOTIFICATIONS = 20
SMALL_EVENTS = 5


class HeldRenders(Kirim):
    """A Kirim whose render of event ``big`` stops at a checkpoint until released."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rendering = threading.Event()
        self.release = threading.Event()

    def prepare_event(self, type: str, recipients: Any, data: Any, *, event_id: str) -> Event:
        if event_id == "big":
            self.rendering.set()
            self.release.wait(60)
        return super().prepare_event(type, recipients, data, event_id=event_id)


def app_on(url: str) -> HeldRenders:
    return HeldRenders(
        Config(database=url),
        channels={"push": Channel(name="push", provider=FlakyProvider())},
        types=[parse_type("digits", TYPE)],
    )


def token_for(url: str) -> str:
    async def go() -> str:
        kirim = app_on(url)
        await kirim.open(migrate=True)
        try:
            return (await create_token(kirim.store, "fair", now=kirim.clock.now()))[1]
        finally:
            await kirim.close()

    return asyncio.run(go())


def test_small_requests_are_answered_while_a_big_event_renders(database_url: str) -> None:
    """A 1,000-recipient event held inside its render; 20 notifications, 5 small events
    and /healthz from other clients are all answered meanwhile (rendering ran on the
    event loop: /healthz timed out behind two nested loops), then the big one is."""
    token = token_for(database_url)
    kirim = app_on(database_url)
    headers = {"Authorization": f"Bearer {token}"}
    big = {
        "type": "digits",
        "event_id": "big",
        "recipients": [f"u-{i}" for i in range(1000)],
        "data": {"items": list(range(50))},
    }

    async def scenario(base: str) -> None:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
            held = asyncio.create_task(client.post("/v1/events", json=big))
            assert await asyncio.to_thread(kirim.rendering.wait, 30)
            notes = [
                client.post(
                    "/v1/notifications",
                    json={"event_id": f"n-{i}", "recipient": "r", "channel": "push", "payload": {}},
                )
                for i in range(SMALL_NOTIFICATIONS)
            ]
            events = [
                client.post(
                    "/v1/events",
                    json={
                        "type": "digits",
                        "event_id": f"e-{i}",
                        "recipients": ["a"],
                        "data": {"items": [i]},
                    },
                )
                for i in range(SMALL_EVENTS)
            ]
            answers = await asyncio.gather(client.get("/healthz"), *notes, *events)
            assert [a.status_code for a in answers] == [200] + [201] * (len(answers) - 1)
            assert not held.done()  # the big one is still in its render
            assert not kirim.release.is_set()
            kirim.release.set()
            answer = await held
            assert answer.status_code == 201, answer.text
            assert len(answer.json()["deliveries"]) == 1000

    with served(create_app(kirim, token_cache=1.0)) as base:
        try:
            asyncio.run(scenario(base))
        finally:
            kirim.release.set()
