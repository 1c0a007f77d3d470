"""One error format across the HTTP API.

Every error, whether kirim's own, a validation failure, an unknown route or an
unexpected exception, is a JSON object::

    {"error": {"code": "validation_error", "message": "…", "details": [
        {"field": "body.event_id", "message": "…", "type": "string_too_short"}]}}

``code`` is stable and meant for programs; ``message`` is one sentence for people;
``details`` lists the offending fields (possibly empty).
"""

from __future__ import annotations

import json
import math
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePath
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kirim.errors import NotSettled, StoreError
from kirim.observe.logging import get_logger

JSON = "application/json"

#: Codes per HTTP status when nothing more precise is known.
_GENERIC = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    500: "internal_error",
    503: "unavailable",
}


class ErrorDetail(BaseModel):
    field: str = Field(
        description="Where: `body.event_id`, `query.limit`, `header.idempotency-key`…"
    )
    message: str
    type: str = Field(description="A machine-readable reason, such as `string_too_short`.")


class ErrorInfo(BaseModel):
    code: str = Field(
        description="Stable, for programs: `unauthorized`, `not_found`, `malformed_json`, "
        "`validation_error`, `unknown_channel`, `payload_too_large`, `body_too_large`, "
        "`unsupported_media_type`, `idempotency_key_reused`, `request_in_progress`, "
        "`not_cancelable`, `not_dead_lettered`, `method_not_allowed`, `unavailable`, "
        "`client_closed_request` (499, logged only: the client is gone), `internal_error`."
    )
    message: str = Field(description="One sentence for people, saying what to fix.")
    details: list[ErrorDetail]


class ErrorBody(BaseModel):
    """Every error response of the API."""

    error: ErrorInfo


class ApiError(Exception):
    """Raised by a route: answered in the API's error format."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        details: Sequence[Mapping[str, str]] = (),
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = list(details)
        self.headers = dict(headers or {})


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    details: Iterable[Mapping[str, str]] = (),
    headers: Mapping[str, str] | None = None,
) -> Response:
    body = {"error": {"code": code, "message": message, "details": [dict(d) for d in details]}}
    return Response(
        json_bytes(body), status_code=status, media_type=JSON, headers=dict(headers or {})
    )


def json_bytes(data: Any) -> bytes:
    """``data`` as UTF-8 JSON; text that has no UTF-8 form (a lone surrogate) is
    written as a ``\\u`` escape instead of failing the response."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(json.loads(text) if isinstance(data, str) else data).encode()


def detail(field: str, message: str, type_: str) -> dict[str, str]:
    return {"field": field, "message": message, "type": type_}


def validation_details(
    errors: Iterable[Mapping[str, Any]], prefix: str = ""
) -> list[dict[str, str]]:
    """pydantic's errors as ``details`` (never echoing the input: it may be huge)."""
    out = []
    for e in errors:
        loc = [str(part) for part in e.get("loc", ())]
        if prefix and (not loc or loc[0] != prefix):
            loc.insert(0, prefix)
        out.append(detail(".".join(loc), str(e.get("msg", "invalid")), str(e.get("type", ""))))
    return out


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for these error statuses, all in the error format."""
    text = {
        400: "Malformed request (the body is not JSON, or a header is invalid).",
        401: "No valid bearer token (see `WWW-Authenticate`).",
        404: "No such notification.",
        409: "Conflict: the request cannot be carried out in the record's current state.",
        413: "The body or the payload is too large.",
        415: "The body is not `application/json`.",
        422: "The request is well-formed but invalid.",
        503: "The database cannot be reached.",
    }
    return {s: {"model": ErrorBody, "description": text.get(s, "Error.")} for s in statuses}


def install(app: FastAPI) -> None:
    """Answer every error in the one format."""
    log = get_logger(component="http")

    async def api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(
            exc.status, exc.code, exc.message, details=exc.details, headers=exc.headers
        )

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        status = exc.status_code
        code = _GENERIC.get(status, "error")
        if status == 404:
            message = "no such resource; the API is under /v1 (see /openapi.json)"
        elif status == 405:
            message = "method not allowed on this resource (see the Allow header)"
        else:
            message = str(exc.detail)
        return error_response(status, code, message, headers=exc.headers)

    async def invalid(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        details = validation_details(exc.errors())
        return error_response(
            422, "validation_error", "the request is invalid; see details", details=details
        )

    async def store_error(_: Request, exc: Exception) -> Response:
        log.error("store_error", error=store_problem(exc))
        return error_response(
            503,
            "unavailable",
            "the database cannot be reached or refused the request; try again",
            headers={"Retry-After": "1"},
        )

    async def not_settled(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, NotSettled)
        wait = max(1, math.ceil(exc.retry_at - time.time()))
        return error_response(409, "not_settled", str(exc), headers={"Retry-After": str(wait)})

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StoreError, store_error)
    app.add_exception_handler(NotSettled, not_settled)
    # any other exception: Unexpected (a middleware, so that nothing is re-raised to the
    # server, whose traceback would print the exception's message)


#: how much of a store error's message a log line keeps
_MAX_PROBLEM = 200


def store_problem(exc: BaseException) -> str:
    """What a log line says of a store error, never the data it was about.

    A database server's error (it has a SQLSTATE) is named by its class and SQLSTATE:
    its message and its DETAIL / CONTEXT may quote the rows (``JSON data, line 1:
    {"t": …``). Otherwise the first line of the message, cut short.
    """
    cause = exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:
        return f"PostgreSQL: {type(cause).__name__} (SQLSTATE {sqlstate})"
    lines = str(exc).splitlines()
    return lines[0][:_MAX_PROBLEM] if lines else type(exc).__name__


def raised_at(exc: BaseException) -> str:
    """Where ``exc`` was raised, as ``package/module.py:line in function``."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown"
    frame = frames[-1]
    path = PurePath(frame.filename)
    return f"{'/'.join(path.parts[-2:])}:{frame.lineno} in {frame.name}"


class Unexpected:
    """Pure ASGI middleware: an exception that nothing else handled is answered 500 in
    the error format and logged in one line, with its type and where it was raised.

    Never its message, nor a traceback: an exception's message may carry a request's
    data (``UnicodeEncodeError`` carries the whole text it could not encode: a
    response body, payload included), and logs never carry payloads.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.log = get_logger(component="http")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            self.log.error(
                "internal_error",
                error=type(exc).__name__,
                at=raised_at(exc),
                method=scope["method"],
                path=scope["path"],
            )
            if not started:  # else the client sees the connection end mid-response
                response = error_response(
                    500, "internal_error", "internal error; see the server's log"
                )
                await response(scope, receive, send)
