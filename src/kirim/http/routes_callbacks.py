"""``POST /v1/callbacks/{channel}``: a provider's delivery callbacks.

The route needs no API token: the provider proves itself with the channel's own
``callback_secret`` (a Standard Webhooks signature) or ``callback_token`` (a bearer
token), checked on the raw body before it is parsed. A channel with neither has
callbacks off: 404, the answer an unknown channel gets too. A failed check is 401,
the same answer whatever failed. A verified callback answers 200 with what it did
(``applied``, ``recorded``, ``repeated``: a resent callback is never an error, so
that a provider stops resending), or 202 when no delivery of the channel has its
message id (logged). Nothing a callback does makes kirim send.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from kirim.http.bodies import parse_json, read_body, require_json, validated
from kirim.http.errors import JSON, ApiError, responses
from kirim.http.models import CallbackIn, CallbackOut, parse_when
from kirim.http.routes_notifications import json_response
from kirim.http.service import service
from kirim.store.base import CallbackOutcome

#: a callback is small: its body is refused past this (or the server's smaller limit)
MAX_CALLBACK_BYTES = 64 * 1024

router = APIRouter(prefix="/v1", tags=["callbacks"])

Channel = Annotated[
    str, Path(min_length=1, max_length=200, description="The channel the message went by.")
]
OPERATION: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {JSON: {"schema": {"$ref": "#/components/schemas/DeliveryCallback"}}},
    },
    "parameters": [
        {
            "name": name,
            "in": "header",
            "required": False,
            "description": text,
            "schema": {"type": "string"},
        }
        for name, text in (
            ("webhook-id", "Standard Webhooks: the callback's id (channel with callback_secret)."),
            ("webhook-timestamp", "Standard Webhooks: epoch seconds, within 5 minutes."),
            ("webhook-signature", "Standard Webhooks: `v1,<base64 HMAC-SHA256>`, space-separated."),
        )
    ],
    "security": [{}, {"callbackToken": []}],
}


def unauthorized() -> ApiError:
    return ApiError(
        401,
        "unauthorized",
        "the callback's signature or token does not verify",
        headers={"WWW-Authenticate": 'Bearer realm="kirim callbacks"'},
    )


@router.post(
    "/callbacks/{channel}",
    summary="A provider's delivery callback",
    response_model=None,
    openapi_extra=OPERATION,
    responses={
        200: {"model": CallbackOut, "description": "Applied, recorded, or said before."},
        202: {
            "model": CallbackOut,
            "description": "No delivery has this message id yet: kept and logged, applied "
            "once kirim records the message (a callback can overtake the provider's answer).",
        },
        **responses(400, 401, 404, 413, 415, 422, 503),
    },
)
async def delivery_callback(request: Request, channel: Channel) -> Response:
    """Record what the provider says became of a message: `delivered`, or `bounced` /
    `failed` (both make the delivery `bounced`). Verified by the channel's
    `callback_secret` (Standard Webhooks) or `callback_token` (bearer); 404 when the
    channel has neither. A delivery in doubt is resolved; a second message confirmed
    delivered for one notification is a measured duplicate. A callback for a message
    kirim has not recorded yet is kept (202) and applied once it is."""
    svc = service(request)
    auth = svc.kirim.callback_auth(channel)
    if auth is None:
        raise ApiError(404, "not_found", "no delivery callbacks for this channel")
    raw = await read_body(request, min(svc.max_body_bytes, MAX_CALLBACK_BYTES))
    if not auth.verify(request.headers, raw):
        svc.log.warning("callback_refused", channel=channel, reason="does not verify")
        raise unauthorized()
    request.scope.setdefault("state", {})["kirim_client"] = f"callback:{channel}"
    require_json(request)
    body = validated(CallbackIn, parse_json(raw), "the callback is invalid; see details")
    at = parse_when(body.at).timestamp() if isinstance(body.at, str) else body.at
    result = await svc.kirim.confirm(
        channel, body.message_id, body.status, key=body.key, reason=body.reason, at=at
    )
    fields = {"channel": channel, "message_id": body.message_id, "status": str(body.status)}
    if result.outcome is CallbackOutcome.UNKNOWN:
        svc.log.warning(
            "callback_unknown", **fields, key_given=body.key is not None, kept=result.kept
        )
        return json_response({"outcome": "unknown", "kept": result.kept}, 202)
    svc.log.info(
        "callback",
        **fields,
        notification_id=result.delivery_id,
        outcome=str(result.outcome),
        delivery_status=str(result.status),
        previous_status=str(result.previous),
        resolved=None if result.resolved is None else str(result.resolved),
    )
    if result.duplicate:
        svc.log.warning(
            "confirmed_duplicate",
            **fields,
            notification_id=result.delivery_id,
            message_ids=",".join(result.message_ids),
        )
    return json_response(
        {
            "outcome": str(result.outcome),
            "notification_id": result.delivery_id,
            "status": None if result.status is None else str(result.status),
            "previous_status": None if result.previous is None else str(result.previous),
            "duplicate": result.duplicate,
        }
    )
