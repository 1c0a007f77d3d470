"""Helpers of the HTTP service's tests: an API client on an app, a server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from kirim.config import ServeSettings
from kirim.engine import Kirim
from kirim.http import create_app
from kirim.tokens import create_token

BODY = {"event_id": "order-1", "recipient": "user-1", "channel": "push", "payload": {"n": 1}}


@dataclass
class Api:
    """An httpx client on the app (ASGI, in the test's own event loop), with a token."""

    client: httpx.AsyncClient
    kirim: Kirim
    app: FastAPI
    token: str

    async def post(self, body: Any = None, *, key: str | None = None, **kw: Any) -> httpx.Response:
        headers = dict(kw.pop("headers", {}))
        if key is not None:
            headers["Idempotency-Key"] = key
        return await self.client.post(
            "/v1/notifications", json=BODY if body is None else body, headers=headers, **kw
        )


@contextlib.asynccontextmanager
async def api_on(
    kirim: Kirim,
    *,
    settings: ServeSettings | None = None,
    token_cache: float = 0.0,
    name: str = "tests",
) -> AsyncIterator[Api]:
    app = create_app(kirim, settings=settings or ServeSettings(), token_cache=token_cache)
    _, secret = await create_token(kirim.store, name, now=kirim.clock.now())
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {secret}"}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://testserver", headers=headers
    ) as client:
        yield Api(client=client, kirim=kirim, app=app, token=secret)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def served(app: FastAPI, *, timeout: float = 15.0, port: int | None = None) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 from a thread (on ``port``, else a free
    one); yields its base URL. On the way out its feed streams are ended first."""
    port = port or free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_config=None, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        hub = getattr(app.state, "feed_hub", None)
        if hub is not None:
            hub.stop()
        server.should_exit = True
        thread.join(timeout=timeout)
