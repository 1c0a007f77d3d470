"""The FastAPI application of ``kirim serve``: the API, the dashboard, /metrics."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.responses import Response

from kirim.config import Config, ServeSettings
from kirim.engine import Kirim
from kirim.http import (
    bulk,
    dashboard,
    dashboard_runs,
    dashboard_topics,
    errors,
    routes_addresses,
    routes_callbacks,
    routes_events,
    routes_feed,
    routes_feed_stream,
    routes_notifications,
    routes_ops,
    routes_recipients,
    routes_topics,
)
from kirim.http.errors import ErrorBody, Unexpected
from kirim.http.feed_cors import FeedCors
from kirim.http.feed_models import FeedMarkIn, FeedTokenIn
from kirim.http.guard import FrameGuard
from kirim.http.models import (
    AddressIn,
    CallbackIn,
    EventIn,
    NotificationIn,
    PreferencesIn,
    TopicEventIn,
)
from kirim.http.service import AccessLog, make_service
from kirim.live import FeedHub
from kirim.observe.metrics import Metrics

#: the API's version (of this document), not kirim's
API_VERSION = "1.0"
DESCRIPTION = """\
kirim records notifications and delivers them **once**: one delivery per
idempotency key, whatever the number of requests, retries or servers.

Every `/v1` route needs `Authorization: Bearer TOKEN` (`kirim token create --name
NAME`). `POST /v1/notifications` honours the `Idempotency-Key` header (IETF
httpapi draft): a replay of a completed request answers the original response
(with `Idempotent-Replayed: true`), a request whose key is still being processed
gets 409, and the same key with another body gets 422. `POST /v1/callbacks/{channel}`
takes providers' delivery callbacks instead, verified by the channel's own secret or
token. `/v1/recipients/{id}/preferences` reads, replaces (`PUT`, the whole
document) and forgets a recipient's preferences, which workers read again when they
claim a delivery. `/v1/recipients/{id}/feed` is the in-app inbox's feed: it takes an
operator token or the recipient's own feed token (`POST /v1/recipients/{id}/feed-token`),
in the header or as `?token=`. Errors share one format:
`{"error": {"code", "message", "details": [{"field", "message", "type"}]}}`.
"""


def _static(name: str) -> bytes:
    return resources.files("kirim.http").joinpath("static", name).read_bytes()


def create_app(
    kirim: Kirim | None = None,
    *,
    config: Config | None = None,
    settings: ServeSettings | None = None,
    metrics: Metrics | None = None,
    token_cache: float = 1.0,
) -> FastAPI:
    """The service on ``kirim``, or on a new ``Kirim(config)``. The server opens it when
    it starts, in its own event loop (a no-op if it is open; the schema is checked), and
    closes it when it stops.

    ``token_cache``: seconds a verified token is remembered (0: ask the store each time).
    """
    if kirim is None:
        kirim = Kirim(config)
    svc = make_service(
        kirim, settings or kirim.config.serve, metrics=metrics, token_cache=token_cache
    )

    hub = FeedHub(svc.kirim)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await svc.kirim.open()
        try:
            yield
        finally:
            await hub.close()
            await svc.kirim.close()

    app = FastAPI(
        title="kirim",
        version=API_VERSION,
        summary="Notification delivery that never sends the same notification twice.",
        description=DESCRIPTION,
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
        generate_unique_id_function=lambda route: route.name,
    )
    app.state.service = svc
    app.state.verifier = svc.verifier
    #: the feed's live updates (``kirim.live``)
    app.state.feed_hub = hub
    errors.install(app)
    app.include_router(routes_notifications.intake_router)
    app.include_router(routes_notifications.router)
    app.include_router(routes_ops.dead_router)
    app.include_router(routes_ops.ops_router)
    app.include_router(routes_callbacks.router)
    app.include_router(routes_feed_stream.router)
    app.include_router(routes_feed.router)
    app.include_router(routes_addresses.router)
    app.include_router(routes_topics.router)
    app.include_router(routes_recipients.router)
    app.include_router(routes_events.router)
    app.include_router(bulk.router)
    app.include_router(dashboard.router)
    app.include_router(dashboard_runs.router)
    app.include_router(dashboard_topics.router)
    css = _static("dashboard.css")
    inbox_js = _static("kirim-inbox.js")

    @app.get("/static/dashboard.css", include_in_schema=False)
    async def stylesheet() -> Response:
        return Response(
            css, media_type="text/css", headers={"Cache-Control": "public, max-age=3600"}
        )

    @app.get("/static/kirim-inbox.js", include_in_schema=False)
    async def inbox_element() -> Response:
        # any page may load the element (a module script needs CORS); it holds no secret
        return Response(
            inbox_js,
            media_type="text/javascript",
            headers={"Cache-Control": "public, max-age=3600", "Access-Control-Allow-Origin": "*"},
        )

    app.openapi = lambda: openapi_document(app)  # type: ignore[method-assign]
    # innermost first: a 500 from Unexpected gets the guard's headers and is logged
    app.add_middleware(Unexpected)
    app.add_middleware(FrameGuard)
    app.add_middleware(AccessLog, svc=svc)
    origins = kirim.config.inbox.allowed_origins
    if origins:  # outermost: a preflight is answered before anything else
        app.add_middleware(FeedCors, origins=origins)
    return app


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document (cached on the app), with the hand-documented schemas."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title,
        version=app.version,
        openapi_version=app.openapi_version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    body = NotificationIn.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas["NewNotification"] = body
    callback = CallbackIn.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas["DeliveryCallback"] = callback
    prefs = PreferencesIn.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(prefs.pop("$defs", {}))
    schemas["PreferencesIn"] = prefs
    event = EventIn.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(event.pop("$defs", {}))
    schemas["NewEvent"] = event
    schemas["AddressIn"] = AddressIn.model_json_schema(ref_template="#/components/schemas/{model}")
    for model in (FeedMarkIn, FeedTokenIn, TopicEventIn):
        schemas[model.__name__] = model.model_json_schema(
            ref_template="#/components/schemas/{model}"
        )
    schemes = doc["components"].setdefault("securitySchemes", {})
    schemes.setdefault(
        "callbackToken",
        {
            "type": "http",
            "scheme": "bearer",
            "description": "A channel's `callback_token` (delivery callbacks only).",
        },
    )
    schemas.setdefault("ErrorBody", ErrorBody.model_json_schema())
    app.openapi_schema = doc
    return doc
