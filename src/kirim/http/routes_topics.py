"""``/v1/topics``: topics, their subscribers and events to them (``kirim.topics``,
docs/topics.md), behind the API's bearer token.

``GET /v1/topics`` lists topics with their subscriber counts, ``GET /v1/topics/{topic}``
one with its latest fan-outs. ``PUT`` and ``DELETE /v1/topics/{topic}/subscribers/{id}``
subscribe and unsubscribe (201 when new, 200 when already; 204, or 404 when there was
none); ``GET .../subscribers`` pages them by id. ``POST /v1/topics/{topic}/events``
(``{"type", "event_id", "data"}``) records an event to everyone subscribed now: 202
(its deliveries are made by the workers), 200 when the same event was given before.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.responses import Response

from kirim import limits
from kirim.errors import InvalidNotification
from kirim.http.auth import require_token
from kirim.http.bodies import json_body
from kirim.http.errors import JSON, ApiError, detail, responses
from kirim.http.models import (
    SubscribersOut,
    SubscriptionOut,
    TopicEventOut,
    TopicOut,
    TopicsOut,
)
from kirim.http.routes_notifications import json_response
from kirim.http.routes_recipients import RecipientId, recipient
from kirim.http.service import service
from kirim.topics import check_topic
from kirim.validation import BadValue

MAX_TOPIC_EVENT_BODY = 256 * 1024
router = APIRouter(prefix="/v1", dependencies=[Depends(require_token)], tags=["topics"])
TopicName = Annotated[
    str,
    Path(min_length=1, max_length=limits.TOPIC.bytes, description="The topic's name."),
]
SUBSCRIBER = "/topics/{topic}/subscribers/{recipient_id}"
POST_OPERATION: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {JSON: {"schema": {"$ref": "#/components/schemas/TopicEventIn"}}},
    }
}


def _topic(topic: str) -> str:
    """The path's topic, checked as every door checks it (422 naming it)."""
    try:
        return check_topic(topic)
    except BadValue as exc:
        raise ApiError(
            422,
            "validation_error",
            f"the topic is invalid: {exc}",
            details=[detail("path.topic", exc.reason, "value_error")],
        ) from None


@router.get(
    "/topics",
    summary="Topics",
    response_model=None,
    responses={200: {"model": TopicsOut, "description": "By name."}, **responses(401, 422, 503)},
)
async def list_topics(
    request: Request, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> Response:
    """Topics by name, each with its subscriber count."""
    found = await service(request).kirim.list_topics(limit=limit)
    return json_response({"topics": [t.to_json() for t in found]})


@router.get(
    "/topics/{topic}",
    summary="A topic",
    response_model=None,
    responses={
        200: {"model": TopicOut, "description": "With its latest fan-outs."},
        **responses(401, 404, 422, 503),
    },
)
async def get_topic(
    request: Request, topic: TopicName, recent: Annotated[int, Query(ge=0, le=100)] = 10
) -> Response:
    """The topic's subscriber count and its latest events, with how far each got."""
    name = _topic(topic)
    found = await service(request).kirim.topic_info(name, recent=recent)
    if found is None:
        raise ApiError(404, "not_found", f"no topic {name!r}")
    return json_response(found.to_json())


@router.get(
    "/topics/{topic}/subscribers",
    summary="A topic's subscribers",
    response_model=None,
    responses={
        200: {"model": SubscribersOut, "description": "A page, by recipient id."},
        **responses(401, 422, 503),
    },
)
async def list_subscribers(
    request: Request,
    topic: TopicName,
    after: Annotated[str | None, Query(min_length=1, max_length=limits.RECIPIENT_ID.bytes)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    """Up to ``limit`` subscribers after ``after``; ``next`` is the next page's."""
    name = _topic(topic)
    found = await service(request).kirim.subscribers(name, after=after, limit=limit)
    following = found[-1] if len(found) == limit else None
    return json_response({"topic": name, "subscribers": found, "next": following})


@router.put(
    SUBSCRIBER,
    summary="Subscribe",
    response_model=None,
    responses={
        200: {"model": SubscriptionOut, "description": "Subscribed already."},
        201: {"model": SubscriptionOut, "description": "Subscribed."},
        **responses(401, 422, 503),
    },
)
async def subscribe(request: Request, topic: TopicName, recipient_id: RecipientId) -> Response:
    """Subscribe the recipient: events to the topic recorded after this reach it."""
    name, rid = _topic(topic), recipient(recipient_id)
    svc = service(request)
    sub = await svc.kirim.subscribe(name, rid)
    if sub.created:
        svc.log.info(
            "topic_subscribed", topic=name, recipient_id=rid, client=request.state.kirim_client
        )
    return json_response(sub.to_json(), status=201 if sub.created else 200)


@router.delete(
    SUBSCRIBER,
    status_code=204,
    summary="Unsubscribe",
    response_model=None,
    responses={204: {"description": "Unsubscribed."}, **responses(401, 404, 422, 503)},
)
async def unsubscribe(request: Request, topic: TopicName, recipient_id: RecipientId) -> Response:
    """End the recipient's subscription; a fan-out of an event recorded before still
    reaches it."""
    name, rid = _topic(topic), recipient(recipient_id)
    svc = service(request)
    if not await svc.kirim.unsubscribe(name, rid):
        raise ApiError(404, "not_found", f"recipient {rid!r} is not subscribed to {name!r}")
    svc.log.info(
        "topic_unsubscribed", topic=name, recipient_id=rid, client=request.state.kirim_client
    )
    return Response(status_code=204)


@router.post(
    "/topics/{topic}/events",
    status_code=202,
    summary="An event to a topic",
    response_model=None,
    openapi_extra=POST_OPERATION,
    responses={
        200: {"model": TopicEventOut, "description": "Given before: the event recorded then."},
        202: {"model": TopicEventOut, "description": "Recorded; the workers fan it out."},
        **responses(400, 401, 413, 415, 422, 503),
    },
)
async def post_topic_event(request: Request, topic: TopicName) -> Response:
    """An event of a notification type to everyone subscribed to the topic now, made
    into deliveries by the workers, in batches (the same type and event id again:
    the event recorded first, and nothing more)."""
    name = _topic(topic)
    svc = service(request)
    raw = await json_body(request, min(MAX_TOPIC_EVENT_BODY, svc.max_body_bytes))
    if (
        not isinstance(raw, dict)
        or set(raw) - {"type", "event_id", "data"}
        or not isinstance(raw.get("data", {}), dict)
    ):
        raise ApiError(
            422,
            "validation_error",
            "the body is {type, event_id, data}",
            details=[detail("body", "must be {type, event_id, data: {...}}", "value_error")],
        )
    kind: Any = raw.get("type")  # checked by the engine, as every door's
    event_id: Any = raw.get("event_id")
    try:
        event = await svc.kirim.notify_topic(kind, name, raw.get("data", {}), event_id=event_id)
    except InvalidNotification as exc:
        raise ApiError(422, "validation_error", str(exc)) from None
    svc.log.info(
        "topic_event",
        topic=name,
        topic_event=event.id,
        created=event.created,
        client=request.state.kirim_client,
    )
    return json_response(event.to_json(), status=202 if event.created else 200)
