"""``/v1/recipients/{recipient_id}/preferences``: read, replace and forget a recipient's
preferences (``kirim.preferences``), behind the API's bearer token.

``PUT`` replaces the whole document (a field left out is reset to its default) and
checks it with the rules the CLI and the Python API use, so one bad value gets one
message wherever it comes in: 422 naming the field (``body.timezone``,
``body.channels['order_shipped:email']``). A recipient without preferences is 404 to
``GET`` and ``DELETE`` (each type's defaults apply to it). A recipient id may hold a
``/`` (send it as ``%2F``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from starlette.responses import Response

from kirim.http.auth import require_token
from kirim.http.bodies import json_body
from kirim.http.errors import JSON, ApiError, ErrorBody, detail, responses
from kirim.http.models import PreferencesOut
from kirim.http.routes_notifications import json_response
from kirim.http.service import service
from kirim.preferences import Preferences, check_known, check_recipient_id
from kirim.validation import MAX_KEY_LENGTH, BadValue
from kirim.views import preferences_json

#: a preferences document is small: its body is refused past this (or the server's limit)
MAX_PREFERENCES_BYTES = 64 * 1024

router = APIRouter(prefix="/v1", dependencies=[Depends(require_token)], tags=["recipients"])

RecipientId = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_KEY_LENGTH,
        description="The recipient's id (as given to `POST /v1/events`).",
    ),
]
PUT_OPERATION: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {JSON: {"schema": {"$ref": "#/components/schemas/PreferencesIn"}}},
    }
}
PATH = "/recipients/{recipient_id:path}/preferences"
#: a recipient id of ``.`` or ``..`` cannot be addressed (clients normalise the path)
NONE: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "The recipient has no preferences (or no such path)."}
}


def invalid(exc: BadValue) -> ApiError:
    """A rule of ``kirim.preferences`` broken by the body: 422 naming the field."""
    field = "body" if exc.name == "preferences" else f"body.{exc.name}"
    return ApiError(
        422,
        "validation_error",
        f"the preferences are invalid: {exc}",
        details=[detail(field, exc.reason, "value_error")],
    )


def recipient(recipient_id: str) -> str:
    """The path's id, checked as every door checks it (422 naming it)."""
    try:
        return check_recipient_id(recipient_id)
    except BadValue as exc:
        raise ApiError(
            422,
            "validation_error",
            f"the recipient id {exc.reason}",
            details=[detail("path.recipient_id", exc.reason, "value_error")],
        ) from None


def no_preferences(recipient_id: str) -> ApiError:
    return ApiError(
        404,
        "not_found",
        f"recipient {recipient_id!r} has no preferences (each type's defaults apply)",
    )


@router.get(
    PATH,
    summary="A recipient's preferences",
    response_model=None,
    responses={
        200: {"model": PreferencesOut, "description": "As stored."},
        **responses(401, 422, 503),
        **NONE,
    },
)
async def get_preferences(request: Request, recipient_id: RecipientId) -> Response:
    """The recipient's opt-outs, channels, time zone and quiet hours (404: none set)."""
    rid = recipient(recipient_id)
    found = await service(request).kirim.preferences(rid)
    if found is None:
        raise no_preferences(rid)
    return json_response(preferences_json(found))


@router.put(
    PATH,
    summary="Set a recipient's preferences",
    response_model=None,
    openapi_extra=PUT_OPERATION,
    responses={
        200: {"model": PreferencesOut, "description": "Stored (the whole document)."},
        **responses(400, 401, 413, 415, 422, 503),
        **NONE,
    },
)
async def put_preferences(request: Request, recipient_id: RecipientId) -> Response:
    """Replace the recipient's preferences, all of them. Deliveries already queued follow
    them when a worker claims them (a suppressed one is recorded `suppressed`)."""
    rid = recipient(recipient_id)
    svc = service(request)
    raw = await json_body(request, min(MAX_PREFERENCES_BYTES, svc.max_body_bytes))
    app = svc.kirim
    try:
        prefs = Preferences.from_json(rid, raw)
        before = await app.preferences(rid)
        new = set(prefs.channels) - set(() if before is None else before.channels)
        check_known(sorted(new), types=app.types, channels=app.channel_names)
    except BadValue as exc:
        raise invalid(exc) from None
    stored = await app.set_preferences(prefs)
    svc.log.info("preferences_set", recipient_id=rid, client=request.state.kirim_client)
    return json_response(preferences_json(stored))


@router.delete(
    PATH,
    status_code=204,
    summary="Forget a recipient's preferences",
    response_model=None,
    responses={204: {"description": "Forgotten."}, **responses(401, 422, 503), **NONE},
)
async def delete_preferences(request: Request, recipient_id: RecipientId) -> Response:
    """Forget the recipient's preferences: each type's defaults apply again."""
    rid = recipient(recipient_id)
    svc = service(request)
    if not await svc.kirim.delete_preferences(rid):
        raise no_preferences(rid)
    svc.log.info("preferences_deleted", recipient_id=rid, client=request.state.kirim_client)
    return Response(status_code=204)
