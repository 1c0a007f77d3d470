"""``/v1/notifications``: record, read, list and cancel notifications."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.responses import Response

from kirim.errors import ActionRefused, NotFound
from kirim.http.auth import authenticate, bearer_secret, require_token
from kirim.http.bodies import json_body, validated
from kirim.http.errors import (
    JSON,
    ApiError,
    detail,
    json_bytes,
    responses,
)
from kirim.http.idempotency import Answer, one_header
from kirim.http.models import DeliveryOut, DeliveryPage, NotificationIn, Timeline
from kirim.http.service import Service, service
from kirim.model import DeliveryStatus, RecordFilter
from kirim.timeline import events
from kirim.validation import MAX_ID
from kirim.views import Record, delivery_json

#: the request body's schema, documented by hand: the body is read and validated by
#: the route itself (size limit, JSON errors, fingerprint)
#: (as are its header and its security: the hot route resolves no dependency)
NEW_OPERATION: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {JSON: {"schema": {"$ref": "#/components/schemas/NewNotification"}}},
    },
    "parameters": [
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "description": "The delivery's idempotency key (a structured-field string such "
            'as `"8e03978e"`, or a bare token), at most 255 printable ASCII characters. The '
            "same key again replays the first response; with another body it is refused "
            "(422); while the first request is in progress, 409. Sent more than once, 400.",
            "schema": {"type": "string", "minLength": 1, "maxLength": 257},
        }
    ],
    "security": [{"bearerToken": []}],
}

router = APIRouter(prefix="/v1", dependencies=[Depends(require_token)], tags=["notifications"])
intake_router = APIRouter(prefix="/v1", tags=["notifications"])

DeliveryId = Annotated[int, Path(ge=1, le=MAX_ID, description="The delivery's id.")]


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``data`` (or JSON text) as the response."""
    return Response(json_bytes(data), status_code=status, media_type=JSON, headers=headers)


async def record_of(svc: Service, delivery_id: int) -> Record:
    """The delivery with this id (never one whose key happens to be these digits)."""
    found = await svc.kirim.get(delivery_id, by="id")
    if found is None:
        raise ApiError(404, "not_found", f"no notification with id {delivery_id}")
    return found


async def act(svc: Service, delivery_id: int, verb: Callable[[], Awaitable[Record]]) -> Record:
    """An operator verb of the engine on one delivery: 404 when it is missing, 409 (with
    the engine's reason) when the verb does not apply to its state."""
    try:
        return await verb()
    except NotFound:
        raise ApiError(404, "not_found", f"no notification with id {delivery_id}") from None
    except ActionRefused as exc:
        raise ApiError(409, exc.code, f"notification {delivery_id}: {exc}") from None


@intake_router.post(
    "/notifications",
    status_code=201,
    summary="Record a notification (idempotent)",
    openapi_extra=NEW_OPERATION,
    responses={
        201: {
            "model": DeliveryOut,
            "description": "Recorded, at `Location`; a replay of the same request answers "
            "the same, `Location` included (with `Idempotent-Replayed: true`).",
        },
        200: {
            "model": DeliveryOut,
            "description": "The key names a delivery recorded before, outside the API, "
            "with the same payload.",
        },
        **responses(400, 401, 409, 413, 415, 422, 503),
    },
)
async def create_notification(request: Request) -> Response:
    """Record one notification for delivery by the workers.

    The idempotency key is the `Idempotency-Key` header, else the body's `key`, else
    kirim's default (sha256 of event, recipient and channel). One delivery per key,
    whatever the number of requests or servers.
    """
    await authenticate(request, bearer_secret(request))
    svc = service(request)
    headers = request.headers
    raw = await json_body(request, svc.max_body_bytes)
    body = validated(NotificationIn, raw, "the notification is invalid; see details")
    key_header = one_header(headers.getlist("idempotency-key"))
    answer: Answer = await svc.intake.accept(body, raw, key_header)
    extra: dict[str, str] = {}
    if answer.replayed:
        extra["Idempotent-Replayed"] = "true"
    if answer.status_code == 201 and answer.delivery_id is not None:
        extra["Location"] = f"/v1/notifications/{answer.delivery_id}"
    return json_response(answer.body, answer.status_code, extra)


@router.get(
    "/notifications",
    summary="List notifications",
    response_model=None,
    responses={200: {"model": DeliveryPage, "description": "A page."}, **responses(401, 422, 503)},
)
async def list_notifications(
    request: Request,
    status: Annotated[DeliveryStatus | None, Query(description="Only this status.")] = None,
    channel: Annotated[
        str | None, Query(min_length=1, max_length=200, description="Only this channel.")
    ] = None,
    cursor: Annotated[
        str | None,
        Query(
            max_length=19,
            pattern=r"^[0-9]+$",
            description="`next_cursor` of the previous page.",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200, description="Page size.")] = 50,
) -> Response:
    """Deliveries oldest first, each with its job and attempts; page with `next_cursor`."""
    svc = service(request)
    after = int(cursor) if cursor else 0
    if after > MAX_ID:
        raise ApiError(
            422,
            "validation_error",
            "cursor is out of range",
            details=[detail("query.cursor", "out of range", "value_error")],
        )
    if channel is not None and "\x00" in channel:
        return json_response({"items": [], "next_cursor": None})
    where = RecordFilter(status=status, channel=channel, oldest_first=True)
    page = await svc.kirim.records(where, cursor=after or None, limit=limit)
    items = [delivery_json(r) for r in page.records]
    next_cursor = None if page.next_cursor is None else str(page.next_cursor)
    return json_response({"items": items, "next_cursor": next_cursor})


@router.get(
    "/notifications/{delivery_id}",
    summary="One notification",
    response_model=None,
    responses={
        200: {"model": DeliveryOut, "description": "The delivery, its job and attempts."},
        **responses(401, 404, 422, 503),
    },
)
async def get_notification(request: Request, delivery_id: DeliveryId) -> Response:
    """The delivery, its most recent job and every attempt (as `kirim status --json`)."""
    return json_response(delivery_json(await record_of(service(request), delivery_id)))


@router.get(
    "/notifications/{delivery_id}/timeline",
    summary="One notification's timeline",
    response_model=None,
    responses={
        200: {"model": Timeline, "description": "Its events as log lines."},
        **responses(401, 404, 422, 503),
    },
)
async def get_timeline(request: Request, delivery_id: DeliveryId) -> Response:
    """Requests, answers, takeovers, status writes and leases, oldest first."""
    svc = service(request)
    record = await record_of(svc, delivery_id)
    found = events(record, now=svc.kirim.clock.now())
    return json_response({"notification_id": delivery_id, "events": [e.json() for e in found]})


@router.post(
    "/notifications/{delivery_id}/cancel",
    summary="Cancel a notification",
    response_model=None,
    responses={
        200: {"model": DeliveryOut, "description": "Canceled."},
        **responses(401, 404, 409, 422, 503),
    },
)
async def cancel_notification(request: Request, delivery_id: DeliveryId) -> Response:
    """Cancel a delivery that is neither in flight nor sent (409 otherwise)."""
    svc = service(request)
    record = await act(svc, delivery_id, lambda: svc.kirim.cancel(delivery_id, by="id"))
    svc.log.info("canceled", notification_id=delivery_id, client=request.state.kirim_client)
    return json_response(delivery_json(record))


@router.post(
    "/notifications/{delivery_id}/reconcile",
    summary="Settle a notification's doubt by asking its provider",
    response_model=None,
    responses={
        200: {
            "model": DeliveryOut,
            "description": "Settled: sent, pending again (its route goes on), or failed "
            "(resolved).",
        },
        **responses(401, 404, 409, 422, 503),
    },
)
async def reconcile_notification(request: Request, delivery_id: DeliveryId) -> Response:
    """Ask the provider whether it has a delivery held in doubt or sent under an
    assumption (its channel's `lookup`), and settle the doubt either way: found,
    `sent` (doubt `resolved`); not found, once no earlier request can still land,
    `pending` again while its job has attempts left (its route goes on: a fallback
    channel after a refusal for good), else `failed` (doubt `resolved`), so that a
    retry sends no second copy. 409 when there
    is no doubt, the provider cannot be asked or does not answer, or an earlier
    request may still land (`not_settled`, with `Retry-After`)."""
    svc = service(request)
    record = await act(svc, delivery_id, lambda: svc.kirim.reconcile(delivery_id, by="id"))
    svc.log.info(
        "reconciled",
        notification_id=delivery_id,
        status=str(record.delivery.status),
        client=request.state.kirim_client,
    )
    return json_response(delivery_json(record))
