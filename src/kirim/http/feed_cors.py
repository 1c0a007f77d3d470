"""CORS for the feed API only (``[inbox] allowed_origins``): the pages of those
origins may call ``/v1/recipients/{id}/feed…`` from the browser; every other path
answers no cross-origin request, as before.

Starlette's ``CORSMiddleware`` does the work (preflights, ``Vary: Origin``); this
wraps it so that it sees only the feed's paths. No credentials (cookies): a feed
token is sent as ``Authorization: Bearer`` or ``?token=``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

#: the feed's paths (and the live stream's, under them)
FEED_PATH = re.compile(r"^/v1/recipients/.+/feed(/.*)?$")


class FeedCors:
    """Pure ASGI middleware: ``CORSMiddleware`` on the feed's paths only."""

    def __init__(self, app: ASGIApp, origins: Sequence[str]) -> None:
        self.app = app
        self.cors = CORSMiddleware(
            app,
            allow_origins=list(origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
            allow_credentials=False,
            max_age=600,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and FEED_PATH.match(scope.get("path", "")):
            await self.cors(scope, receive, send)
            return
        await self.app(scope, receive, send)
