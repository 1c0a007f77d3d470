"""``/v1/recipients/{recipient_id}/feed``: the in-app inbox's feed of one recipient
(``kirim.inbox``), for the recipient's own page or the application's backend.

Two kinds of token reach it: an operator token (``kirim token create``), for any
recipient, and a feed token (``kfeed_…``, ``kirim.feed_tokens``) for its own
recipient's feed only (403 for another's; 401 when forged or expired). A browser's
``EventSource`` cannot set a header, so a feed token may come as ``?token=`` too;
an operator token only in ``Authorization: Bearer``, and ``POST .../feed-token``
(which makes feed tokens) needs one. The access log never shows the query string.

Every state change is idempotent: a mark set keeps its first time. An item of
another recipient's, or none, is 404.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials
from starlette.responses import Response

from kirim.errors import ConfigError, NotFound
from kirim.feed_tokens import BadFeedToken, is_feed_token
from kirim.http.auth import REALM, authenticate, bearer, bearer_secret
from kirim.http.bodies import json_body, validated
from kirim.http.errors import JSON, ApiError, ErrorBody, responses
from kirim.http.feed_models import (
    MAX_ITEM_ID,
    FeedCountsOut,
    FeedItemOut,
    FeedMarkIn,
    FeedMarkOut,
    FeedPageOut,
    FeedTokenIn,
    FeedTokenOut,
)
from kirim.http.routes_notifications import json_response
from kirim.http.routes_recipients import RecipientId, recipient
from kirim.http.service import service
from kirim.inbox import MAX_PAGE, FeedAction, FeedFilter, iso

#: a mark's body is small
MAX_MARK_BODY = 64 * 1024
FEED = "/recipients/{recipient_id:path}/feed"
router = APIRouter(prefix="/v1", tags=["feed"])

ItemPath = Annotated[int, Path(ge=1, le=MAX_ITEM_ID, description="The feed item's id.")]
#: the statuses of a route a feed token may call
FEED_ERRORS: dict[int | str, dict[str, Any]] = {
    **responses(401, 422, 503),
    403: {"model": ErrorBody, "description": "A feed token of another recipient."},
}
NO_ITEM: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "The recipient has no such feed item."}
}


def _body(model: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{model}"}}},
        }
    }


async def feed_reader(
    request: Request,
    recipient_id: RecipientId,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    token: Annotated[
        str | None,
        Query(
            max_length=2048,
            description="A feed token, for a client that cannot set a header (EventSource).",
        ),
    ] = None,
) -> str:
    """The recipient id of the path, once the request may read its feed: a feed token
    of that recipient (header or ``?token=``), or an operator token (header)."""
    rid = recipient(recipient_id)
    secret = credentials.credentials if credentials is not None else token
    if secret is not None and is_feed_token(secret):
        try:
            owner = service(request).kirim.feed_token_recipient(secret)
        except BadFeedToken as exc:
            raise ApiError(
                401,
                "unauthorized",
                f"{exc}: ask the application for a new feed token",
                headers={"WWW-Authenticate": f'{REALM}, error="invalid_token"'},
            ) from None
        if owner != rid:
            raise ApiError(403, "forbidden", "this feed token is for another recipient's feed")
        request.scope.setdefault("state", {})["kirim_client"] = "feed-token"
        return rid
    await authenticate(request, bearer_secret(request))
    return rid


Reader = Annotated[str, Depends(feed_reader)]


def _no_item(rid: str, item_id: int) -> ApiError:
    return ApiError(404, "not_found", f"recipient {rid!r} has no feed item {item_id}")


@router.get(
    FEED,
    summary="A recipient's feed",
    response_model=None,
    responses={200: {"model": FeedPageOut, "description": "Newest first."}, **FEED_ERRORS},
)
async def get_feed(
    request: Request,
    rid: Reader,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    before: Annotated[
        int | None, Query(ge=1, le=MAX_ITEM_ID, description="A page's `next_before`.")
    ] = None,
    filter: Annotated[
        FeedFilter | None,
        Query(description="unseen, unread, archived or all; by default, every one not archived."),
    ] = None,
) -> Response:
    """One page of the recipient's feed, newest first, with its counts. Archived
    messages are listed only with `filter=archived` (or `all`)."""
    page = await service(request).kirim.feed(
        rid, filter=filter or FeedFilter.INBOX, limit=limit, before=before
    )
    return json_response(page.to_json())


@router.get(
    FEED + "/counts",
    summary="A recipient's feed counts",
    response_model=None,
    responses={
        200: {"model": FeedCountsOut, "description": "Of messages not archived."},
        **FEED_ERRORS,
    },
)
async def get_feed_counts(request: Request, rid: Reader) -> Response:
    """How many of the recipient's messages not archived are not seen, and not read
    (the bell's badge)."""
    return json_response((await service(request).kirim.feed_counts(rid)).to_json())


@router.post(
    FEED + "/mark",
    summary="Mark many feed items",
    response_model=None,
    openapi_extra=_body("FeedMarkIn"),
    responses={
        200: {"model": FeedMarkOut, "description": "How many changed."},
        **responses(400, 413, 415),
        **FEED_ERRORS,
    },
)
async def mark_feed(request: Request, rid: Reader) -> Response:
    """Set `seen`, `read` or `archived` on the messages `ids` of the recipient's, or on
    every one of them when `ids` is null ("mark all read"). Messages of other
    recipients' among `ids` are left alone."""
    svc = service(request)
    raw = await json_body(request, min(MAX_MARK_BODY, svc.max_body_bytes))
    body = validated(FeedMarkIn, raw, "the body is {ids, state}; see details")
    changed = await svc.kirim.mark_feed(rid, body.state, body.ids)
    return json_response({"changed": changed})


def _action_route(action: FeedAction) -> None:
    """``POST .../feed/{item_id}/<action>``."""

    async def act(request: Request, rid: Reader, item_id: ItemPath) -> Response:
        try:
            item = await service(request).kirim.feed_action(rid, item_id, action)
        except NotFound:
            raise _no_item(rid, item_id) from None
        return json_response(item.to_json())

    act.__doc__ = {
        FeedAction.SEEN: "Mark the message seen (kept: its first time).",
        FeedAction.READ: "Mark the message read, and seen if it was not (kept: the first times).",
        FeedAction.UNREAD: "Clear the message's read mark (its seen mark stays).",
        FeedAction.ARCHIVE: "Archive the message: out of the default list and the counts.",
        FeedAction.UNARCHIVE: "Bring an archived message back into the feed.",
    }[action]
    router.add_api_route(
        FEED + "/{item_id}/" + action.value,
        act,
        methods=["POST"],
        name=f"feed_{action.value}",
        summary=f"Feed item: {action.value}",
        response_model=None,
        responses={
            200: {"model": FeedItemOut, "description": "The message after it."},
            **FEED_ERRORS,
            **NO_ITEM,
        },
    )


for _action in FeedAction:
    _action_route(_action)


@router.delete(
    FEED + "/{item_id}",
    status_code=204,
    summary="Delete a feed item",
    response_model=None,
    responses={204: {"description": "Deleted."}, **FEED_ERRORS, **NO_ITEM},
)
async def delete_feed_item(request: Request, rid: Reader, item_id: ItemPath) -> Response:
    """Delete one message of the recipient's for good."""
    try:
        await service(request).kirim.delete_feed_item(rid, item_id)
    except NotFound:
        raise _no_item(rid, item_id) from None
    return Response(status_code=204)


@router.post(
    "/recipients/{recipient_id:path}/feed-token",
    summary="Make a feed token",
    response_model=None,
    openapi_extra=_body("FeedTokenIn"),
    responses={
        200: {"model": FeedTokenOut, "description": "Give it to the recipient's page."},
        **responses(400, 401, 413, 415, 422, 503),
        403: {"model": ErrorBody, "description": "A feed token cannot make one."},
        409: {"model": ErrorBody, "description": "No `[inbox] secret` is configured."},
    },
)
async def create_feed_token(
    request: Request,
    recipient_id: RecipientId,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Response:
    """A token that reads and marks this recipient's feed, and nothing else, until it
    expires: for the application's backend to hand to the recipient's page (operator
    token only)."""
    del credentials  # documented for the OpenAPI; checked here with the operator's rules
    await authenticate(request, bearer_secret(request))
    rid = recipient(recipient_id)
    svc = service(request)
    raw = await json_body(request, min(MAX_MARK_BODY, svc.max_body_bytes))
    body = validated(FeedTokenIn, raw, "the body is {ttl_seconds}; see details")
    try:
        token, expires_at = svc.kirim.feed_token(rid, ttl=body.ttl_seconds)
    except ConfigError as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    svc.log.info("feed_token_made", recipient_id=rid, client=request.state.kirim_client)
    return json_response({"token": token, "expires_at": iso(expires_at)})
