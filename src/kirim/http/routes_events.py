"""``POST /v1/events``: one event of a notification type, to many recipients
(``kirim.http.events``; the Python call is ``Kirim.notify_event``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from kirim.http.auth import authenticate, bearer_secret
from kirim.http.bodies import json_body, validated
from kirim.http.errors import JSON, responses
from kirim.http.events import EventIntake
from kirim.http.idempotency import HOLD, one_header
from kirim.http.models import EventIn, EventOut
from kirim.http.routes_notifications import json_response
from kirim.http.service import service

NEW_EVENT: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {JSON: {"schema": {"$ref": "#/components/schemas/NewEvent"}}},
    },
    "parameters": [
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "description": "The request's idempotency key (a structured-field string or a "
            "bare token, at most 255 printable ASCII characters), and the event's id when "
            "the body has no `event_id`. Without it the key is the event's type and id. "
            "The same key again replays the first response; with another body, 422; while "
            "the first request is in progress, 409. Sent more than once, 400.",
            "schema": {"type": "string", "minLength": 1, "maxLength": 257},
        }
    ],
    "security": [{"bearerToken": []}],
}

router = APIRouter(prefix="/v1", tags=["events"])


@router.post(
    "/events",
    status_code=201,
    summary="Record one event for many recipients (idempotent)",
    openapi_extra=NEW_EVENT,
    responses={
        201: {
            "model": EventOut,
            "description": "Recorded: one entry per recipient x channel. A replay of the "
            "same request answers the same (with `Idempotent-Replayed: true`).",
        },
        200: {
            "model": EventOut,
            "description": "The event was recorded before (under another key, or from "
            "Python): every delivery existed already (`created: false`).",
        },
        **responses(400, 401, 409, 413, 415, 422, 503),
    },
)
async def create_event(request: Request) -> Response:
    """Render one event of a notification type for every recipient and channel, apply
    the recipients' preferences, throttles and digests, and record the deliveries in
    one transaction. Nothing is written when a template fails or a variable is
    missing (422)."""
    await authenticate(request, bearer_secret(request))
    svc = service(request)
    raw = await json_body(request, svc.max_body_bytes)
    body = validated(EventIn, raw, "the event is invalid; see details")
    intake = EventIntake(svc.kirim, hold=HOLD)
    answer = await intake.accept(
        body.as_call(), raw, one_header(request.headers.getlist("idempotency-key"))
    )
    headers = {"Idempotent-Replayed": "true"} if answer.replayed else None
    return json_response(answer.body, answer.status_code, headers)
