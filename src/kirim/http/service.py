"""What the routes share: the ``Kirim`` app, token verifier, intake, metrics, settings."""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kirim.config import ServeSettings
from kirim.engine import Kirim
from kirim.http.auth import TokenVerifier
from kirim.http.idempotency import Intake
from kirim.observe.logging import get_logger
from kirim.observe.metrics import Metrics

#: seconds: from a fraction of a millisecond (a replay) to a slow database
HTTP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


@dataclass(slots=True)
class HttpMetrics:
    """The service's own series, on the ``Metrics`` registry it was given."""

    requests: Any
    latency: Any
    _children: dict[tuple[str, str, str], Any] = field(default_factory=dict)
    _latency: dict[str, Any] = field(default_factory=dict)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        labels = (method, route, str(status))
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = self.requests.labels(*labels)
        child.inc()
        hist = self._latency.get(route)
        if hist is None:
            hist = self._latency[route] = self.latency.labels(route)
        hist.observe(seconds)


_HTTP_METRICS: weakref.WeakKeyDictionary[Metrics, HttpMetrics] = weakref.WeakKeyDictionary()


def http_metrics(metrics: Metrics) -> HttpMetrics:
    """The HTTP series of a ``Metrics`` (registered once per registry)."""
    found = _HTTP_METRICS.get(metrics)
    if found is None:
        found = _HTTP_METRICS[metrics] = HttpMetrics(
            requests=Counter(
                "kirim_http_requests",
                "HTTP requests served, by method, route and status.",
                ["method", "route", "status"],
                registry=metrics.registry,
            ),
            latency=Histogram(
                "kirim_http_request_duration_seconds",
                "HTTP request latency, by route.",
                ["route"],
                buckets=HTTP_BUCKETS,
                registry=metrics.registry,
            ),
        )
    return found


@dataclass(slots=True)
class Service:
    kirim: Kirim
    settings: ServeSettings
    metrics: Metrics
    verifier: TokenVerifier
    intake: Intake
    http: HttpMetrics
    log: Any
    #: when the queue gauges were last read from the store (monotonic seconds)
    stats_at: float = -1.0

    @property
    def max_body_bytes(self) -> int:
        return self.settings.max_body_bytes


def make_service(
    kirim: Kirim,
    settings: ServeSettings,
    *,
    metrics: Metrics | None = None,
    token_cache: float = 1.0,
) -> Service:
    metrics = metrics or kirim.metrics or Metrics()
    if kirim.metrics is None:
        kirim.metrics = metrics
    return Service(
        kirim=kirim,
        settings=settings,
        metrics=metrics,
        verifier=TokenVerifier(kirim.store, ttl=token_cache),
        intake=Intake(kirim),
        http=http_metrics(metrics),
        log=get_logger(component="http"),
    )


def service(request: Request) -> Service:
    svc: Service = request.app.state.service
    return svc


class AccessLog:
    """Pure ASGI middleware: one log line and the HTTP metrics per request.

    Logs the method, the path (never the query string, never a header), the status,
    the time taken and the *name* of the token used, if any.
    """

    def __init__(self, app: ASGIApp, svc: Service) -> None:
        self.app = app
        self.svc = svc

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - started
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.svc.http.observe(scope["method"], template, status, seconds)
            client = (scope.get("state") or {}).get("kirim_client")
            self.svc.log.info(
                "http_request",
                method=scope["method"],
                path=scope["path"],
                status=status,
                duration_ms=round(seconds * 1000, 2),
                **({} if client is None else {"client": client}),
            )
