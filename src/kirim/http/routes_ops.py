"""Dead letters, health, readiness and Prometheus metrics."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from starlette.responses import Response

from kirim.errors import KirimError
from kirim.http.auth import optional_client, require_token
from kirim.http.errors import error_response, responses
from kirim.http.models import DeadLetters, Health, RetriedOut
from kirim.http.routes_notifications import DeliveryId, act, json_response
from kirim.http.service import service
from kirim.observe.metrics import CONTENT_TYPE
from kirim.views import delivery_json

dead_router = APIRouter(prefix="/v1", dependencies=[Depends(require_token)], tags=["dead letters"])
ops_router = APIRouter(tags=["operations"])

#: /metrics reads the queue gauges from the store at most this often (seconds)
STATS_EVERY = 1.0


@dead_router.get(
    "/dead-letters",
    summary="Dead-lettered notifications",
    response_model=None,
    responses={
        200: {"model": DeadLetters, "description": "Oldest first."},
        **responses(401, 422, 503),
    },
)
async def list_dead_letters(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=500, description="At most this many.")] = 100,
) -> Response:
    """Deliveries whose job is dead (failed for good, out of attempts, or held in doubt)."""
    dead = await service(request).kirim.dead_letters(limit=limit)
    return json_response({"items": [delivery_json(r) for r in dead]})


@dead_router.post(
    "/dead-letters/{delivery_id}/retry",
    summary="Retry a dead letter",
    response_model=None,
    responses={
        200: {"model": RetriedOut, "description": "Requeued with a fresh job."},
        **responses(401, 404, 409, 422, 503),
    },
)
async def retry_dead_letter(request: Request, delivery_id: DeliveryId) -> Response:
    """Requeue a dead-lettered delivery with a fresh job.

    This releases any earlier doubt: for a delivery held in doubt, the operator
    accepts that the notification may arrive twice (`second_copy_possible` says when
    it may; `POST /v1/notifications/{id}/reconcile` first settles the doubt). On a
    channel whose provider can be asked, the doubt is kept and the worker asks the
    provider before it sends anything.
    """
    svc = service(request)
    before = await svc.kirim.get(delivery_id, by="id")
    possible = before is not None and svc.kirim.second_copy_possible(before)
    record = await act(svc, delivery_id, lambda: svc.kirim.retry(delivery_id, by="id"))
    svc.log.info(
        "dead_letter_retried",
        notification_id=delivery_id,
        client=request.state.kirim_client,
        second_copy_possible=possible,
    )
    return json_response({**delivery_json(record), "second_copy_possible": possible})


@ops_router.get(
    "/healthz",
    summary="Liveness",
    response_model=Health,
    responses={200: {"description": "The process serves requests."}},
)
async def healthz() -> Response:
    """The process is up (it does not touch the database: see /readyz)."""
    return json_response({"status": "ok"})


@ops_router.get(
    "/readyz",
    summary="Readiness",
    response_model=Health,
    responses={
        200: {"description": "The database answers and has this kirim's schema."},
        **responses(503),
    },
)
async def readyz(request: Request) -> Response:
    """The database is reachable and its schema is this kirim's."""
    try:
        await service(request).kirim.store.check_schema()
    except KirimError as exc:
        return error_response(503, "unavailable", f"not ready: {exc}", headers={"Retry-After": "1"})
    return json_response({"status": "ready"})


@ops_router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_model=None,
    openapi_extra={"security": [{}, {"bearerToken": []}]},
    responses={
        200: {
            "content": {CONTENT_TYPE.split(";")[0]: {"schema": {"type": "string"}}},
            "description": "The text exposition.",
        },
        **responses(401),
    },
)
async def metrics(request: Request) -> Response:
    """kirim's metrics (the Metrics registry) and the queue gauges, read from the store.

    Needs a bearer token when the server runs with `--protect-metrics`.
    """
    svc = service(request)
    await optional_client(request, required=svc.settings.protect_metrics)
    now = time.monotonic()
    if now - svc.stats_at >= STATS_EVERY:
        svc.stats_at = now
        try:
            svc.metrics.set_queue_stats(
                await svc.kirim.store.queue_stats(now=svc.kirim.clock.now())
            )
        except KirimError as exc:  # the counters are still worth serving
            svc.log.warning("queue_stats_failed", error=str(exc))
    return Response(svc.metrics.render(), media_type=CONTENT_TYPE)
