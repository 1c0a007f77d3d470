"""``GET /v1/recipients/{recipient_id}/feed/stream``: a recipient's feed, live, as
Server-Sent Events (``sse-starlette``), read through ``kirim.live``.

The same tokens as the feed's (a feed token in the header or ``?token=``, since a
browser's ``EventSource`` cannot set a header; an operator token in the header). The
events, each with ``id:`` the number of the feed write it tells of:

- ``message``: a new message (the ITEM);
- ``state``: a message whose marks changed (the ITEM as it is now);
- ``deleted``: ``{"id": n}``;
- ``counts``: ``{"unseen", "unread"}``, after each batch and first of all.

A browser that reconnects sends ``Last-Event-ID`` (or, reconnecting by hand,
``?last_event_id=``) and is sent what was written after it, each message as it is
now: nothing missed, nothing repeated. A comment every 15 seconds keeps proxies from
closing a quiet stream; a stream of a feed token ends when the token expires.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from kirim import feed_tokens
from kirim.errors import StoreError
from kirim.http.auth import bearer_secret
from kirim.http.routes_feed import FEED, FEED_ERRORS, Reader
from kirim.http.service import service
from kirim.live import FeedHub
from kirim.store.feed_changes import FeedChange

router = APIRouter(prefix="/v1", tags=["feed"])

#: seconds between two heartbeats (a comment) on a quiet stream
HEARTBEAT = 15.0
#: milliseconds a browser waits before it reconnects (the events' ``retry:``)
RETRY_MS = 1000
_MAX_ID = 2**63 - 1
STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "description": "One event: `data` is its JSON text.",
                    "properties": {
                        "event": {"enum": ["message", "state", "deleted", "counts"]},
                        "id": {"type": "string", "pattern": "^[0-9]+$"},
                        "data": {"type": "string"},
                        "retry": {"type": "integer"},
                    },
                    "required": ["event", "id", "data"],
                }
            }
        },
        "description": "Events `message`, `state`, `deleted` and `counts`, each with its `id`.",
    },
    **FEED_ERRORS,
}


def hub_of(request: Request) -> FeedHub:
    hub: FeedHub = request.app.state.feed_hub
    return hub


def change_event(change: FeedChange) -> ServerSentEvent:
    """The event a stream sends for one change of the feed."""
    if change.item is None:
        data: dict[str, Any] = {"id": change.item_id}
    else:
        data = change.item.to_json()
    return ServerSentEvent(data=json.dumps(data), event=change.kind, id=str(change.seq))


def _resume_from(request: Request, given: int | None) -> int | None:
    """The number a reconnecting browser last had: ``?last_event_id=``, else the
    ``Last-Event-ID`` header (one that is not a number is taken as none)."""
    if given is not None:
        return given
    header = request.headers.get("last-event-id", "").strip()
    if header.isascii() and header.isdigit() and len(header) <= 18:
        return int(header)
    return None


def _deadline(request: Request) -> float | None:
    """When the stream must end (``time.monotonic()``): when its feed token expires
    (None: an operator token)."""
    secret = bearer_secret(request) or request.query_params.get("token")
    kirim = service(request).kirim
    if secret is None or not feed_tokens.is_feed_token(secret):
        return None
    assert kirim.config.inbox.secret is not None  # the reader checked the token with it
    now = kirim.clock.now()
    expires_at = feed_tokens.verify(kirim.config.inbox.secret, secret, now)[1]
    return time.monotonic() + (expires_at - now)


async def events(
    hub: FeedHub, recipient_id: str, after: int | None, *, until: float | None = None
) -> AsyncIterator[ServerSentEvent]:
    """The stream of ``recipient_id``'s feed after number ``after`` (None: from now),
    until the hub stops or ``until`` (``time.monotonic()``) passes. A database that
    fails ends the stream (logged): the browser reconnects from its last event id."""
    try:
        async for event in _events(hub, recipient_id, after, until=until):
            yield event
    except StoreError as exc:
        hub.kirim.log.warning("feed_stream_stopped", error=str(exc))


async def _events(
    hub: FeedHub, recipient_id: str, after: int | None, *, until: float | None
) -> AsyncIterator[ServerSentEvent]:
    async with hub.subscribe(recipient_id) as woke:
        if after is None or after > await hub.last_number():
            # a new stream, or a number from another database: from now on
            after = await hub.head(recipient_id)
        first = True
        while not hub.stopping:
            woke.clear()
            batch = await hub.read(recipient_id, after)
            for change in batch.changes:
                yield change_event(change)
            if batch.changes or first:
                yield ServerSentEvent(
                    data=json.dumps(batch.counts.to_json()),
                    event="counts",
                    id=str(batch.last),
                    retry=RETRY_MS if first else None,
                )
            after, first = batch.last, False
            if batch.more:
                continue
            left = None if until is None else until - time.monotonic()
            if left is not None and left <= 0:
                return
            try:
                async with asyncio.timeout(left):
                    await woke.wait()
            except TimeoutError:
                return


@router.get(
    FEED + "/stream",
    summary="A recipient's feed, live (Server-Sent Events)",
    response_model=None,
    response_class=EventSourceResponse,
    responses=STREAM_RESPONSES,
)
async def feed_stream(
    request: Request,
    rid: Reader,
    last_event_id: Annotated[
        int | None,
        Query(
            ge=0,
            le=_MAX_ID,
            description="Resume after this event id (as the `Last-Event-ID` header does).",
        ),
    ] = None,
) -> EventSourceResponse:
    """The events of the feed from now on, or after the event id the browser last had."""
    hub = hub_of(request)
    after = _resume_from(request, last_event_id)
    until = _deadline(request)
    return EventSourceResponse(
        events(hub, rid, after, until=until),
        ping=HEARTBEAT,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
