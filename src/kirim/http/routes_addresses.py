"""``/v1/recipients/{recipient_id}/addresses``: a recipient's addresses per channel
(``kirim.addresses``), behind the API's bearer token.

``GET`` lists them, retired ones too (marked, with when and why); ``POST`` adds one
(``{"channel", "address", "label"}``), checked as the channel's provider takes it (a
device token, an E.164 phone, a subscription's JSON): 422 naming ``body.address``
when it cannot be one; adding a retired one registers it again. ``DELETE
?channel=C&address=A`` forgets one (404 when the recipient has none such).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from starlette.responses import Response

from kirim.errors import UnknownChannel
from kirim.http.auth import require_token
from kirim.http.bodies import json_body
from kirim.http.errors import JSON, ApiError, detail, responses
from kirim.http.models import AddressesOut, AddressOut
from kirim.http.routes_notifications import json_response
from kirim.http.routes_recipients import RecipientId, recipient
from kirim.http.service import service
from kirim.validation import BadValue

MAX_ADDRESS_BODY = 16 * 1024
PATH = "/recipients/{recipient_id:path}/addresses"
router = APIRouter(prefix="/v1", dependencies=[Depends(require_token)], tags=["recipients"])
POST_OPERATION: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {JSON: {"schema": {"$ref": "#/components/schemas/AddressIn"}}},
    }
}


def refused(exc: BadValue | UnknownChannel, field: str) -> ApiError:
    reason = exc.reason if isinstance(exc, BadValue) else str(exc)
    return ApiError(
        422,
        "validation_error",
        f"the address is invalid: {exc}",
        details=[detail(f"body.{field}" if field else "body", reason, "value_error")],
    )


@router.get(
    PATH,
    summary="A recipient's addresses",
    response_model=None,
    responses={
        200: {"model": AddressesOut, "description": "Retired ones too."},
        **responses(401, 422, 503),
    },
)
async def list_addresses(request: Request, recipient_id: RecipientId) -> Response:
    """Every address of the recipient on every channel, retired ones marked."""
    rid = recipient(recipient_id)
    found = await service(request).kirim.addresses(rid)
    return json_response({"recipient_id": rid, "addresses": [a.to_json() for a in found]})


@router.post(
    PATH,
    status_code=201,
    summary="Add an address",
    response_model=None,
    openapi_extra=POST_OPERATION,
    responses={
        201: {"model": AddressOut, "description": "Stored (or registered again)."},
        **responses(400, 401, 413, 415, 422, 503),
    },
)
async def add_address(request: Request, recipient_id: RecipientId) -> Response:
    """Give the recipient an address on a channel: each event to it on that channel
    goes to each of its addresses (a delivery each)."""
    rid = recipient(recipient_id)
    svc = service(request)
    raw = await json_body(request, min(MAX_ADDRESS_BODY, svc.max_body_bytes))
    if not isinstance(raw, dict) or set(raw) - {"channel", "address", "label"}:
        raise ApiError(
            422,
            "validation_error",
            "the body is {channel, address, label}",
            details=[detail("body", "must be {channel, address, label}", "value_error")],
        )
    channel: Any = raw.get("channel")  # checked by the engine, as every door's
    address: Any = raw.get("address")
    try:
        added = await svc.kirim.add_address(rid, channel, address, label=raw.get("label"))
    except UnknownChannel as exc:
        raise refused(exc, "channel") from None
    except BadValue as exc:
        raise refused(
            exc, exc.name if exc.name in ("channel", "address", "label") else ""
        ) from None
    svc.log.info(
        "address_added", recipient_id=rid, channel=added.channel, client=request.state.kirim_client
    )
    return json_response(added.to_json(), status=201)


@router.delete(
    PATH,
    status_code=204,
    summary="Forget an address",
    response_model=None,
    responses={204: {"description": "Forgotten."}, **responses(401, 404, 422, 503)},
)
async def remove_address(
    request: Request,
    recipient_id: RecipientId,
    channel: Annotated[str, Query(min_length=1, max_length=200)],
    address: Annotated[str, Query(min_length=1, max_length=1024)],
) -> Response:
    """Forget one address of the recipient (its deliveries already made stay)."""
    rid = recipient(recipient_id)
    svc = service(request)
    try:
        gone = await svc.kirim.remove_address(rid, channel, address)
    except (BadValue, UnknownChannel) as exc:
        raise ApiError(422, "validation_error", f"the address is invalid: {exc}") from None
    if not gone:
        raise ApiError(404, "not_found", f"recipient {rid!r} has no such address on {channel!r}")
    svc.log.info(
        "address_removed", recipient_id=rid, channel=channel, client=request.state.kirim_client
    )
    return Response(status_code=204)
