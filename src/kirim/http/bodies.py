"""A request's body, read once the same way by every route that takes one: 415 unless
it is JSON, 413 past the route's limit, 499 when the client goes away, 400 when it is
not JSON, 422 (naming the fields) when it does not fit the route's model."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from kirim.http.errors import JSON, ApiError, detail, validation_details

#: the status of a request whose client went away before it was read (nginx's 499)
CLIENT_CLOSED = 499

M = TypeVar("M", bound=BaseModel)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 past ``limit`` bytes (announced or streamed). A client
    that goes away before its body ends is answered (logged and counted) 499, the
    status for a request its client closed: never an internal error."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(
            CLIENT_CLOSED,
            "client_closed_request",
            "the client closed the connection before its request's body ended",
        ) from None
    return b"".join(chunks)


def too_large(limit: int) -> ApiError:
    return ApiError(413, "body_too_large", f"the request body is over the limit of {limit} bytes")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: JSON as RFC 8259 has it: NaN and Infinity are refused
_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def parse_json(raw: bytes) -> Any:
    """``raw`` decoded (UTF-8, RFC 8259); 400 ``malformed_json`` otherwise."""
    try:
        return _DECODER.decode(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(
            400,
            "malformed_json",
            f"the body is not valid JSON: {exc}",
            details=[detail("body", str(exc), "json_invalid")],
        ) from None
    except RecursionError:
        raise ApiError(400, "malformed_json", "the body is nested too deeply") from None


def is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == JSON or (media.startswith("application/") and media.endswith("+json"))


def require_json(request: Request) -> None:
    """415 unless the request says its body is JSON."""
    if not is_json(request.headers.get("content-type")):
        raise ApiError(415, "unsupported_media_type", "send the body as application/json")


async def json_body(request: Request, limit: int) -> Any:
    """The request's body as JSON: 415, then 413 past ``limit`` bytes, then 400."""
    require_json(request)
    return parse_json(await read_body(request, limit))


def validated(model: type[M], raw: Any, invalid: str) -> M:
    """``raw`` as ``model``; else 422 ``validation_error`` with the message ``invalid``
    and a detail per field (``body.…``)."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ApiError(
            422,
            "validation_error",
            invalid,
            details=validation_details(exc.errors(include_input=False), "body"),
        ) from None
    except RecursionError:
        raise ApiError(422, "validation_error", "the body is nested too deeply") from None
