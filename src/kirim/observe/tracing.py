"""OpenTelemetry spans for deliveries, when ``opentelemetry-api`` is installed.

``pip install 'kirim[otel]'`` and configure an SDK (exporter, sampler) as usual:
each delivery attempt becomes a ``kirim.delivery`` span and each provider request a
child ``kirim.provider_request`` span, with the same correlation attributes as the
log lines (``notification_id``, ``event_id``, ``job_id``, ``attempt``,
``worker_id``, ``idempotency_key``, ``provider_request_id``) and the outcome.

The import is tried once, here. Without the package (or while no SDK tracer
provider is configured), ``default_tracer()`` is None and the worker calls nothing
of this module on its hot path.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

try:  # the optional extra: tried once
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - depends on the install
    _trace = None  # type: ignore[assignment,unused-ignore]

#: Whether ``opentelemetry-api`` is importable.
AVAILABLE = _trace is not None
TRACER_NAME = "kirim"
DELIVERY_SPAN = "kirim.delivery"
REQUEST_SPAN = "kirim.provider_request"

Tracer = Any  # opentelemetry.trace.Tracer, when installed
Span = Any


def default_tracer() -> Tracer | None:
    """kirim's tracer from the global tracer provider; None without the extra, or while
    no SDK provider is set (spans would be dropped: making them would only cost time).

    Configure the SDK (``trace.set_tracer_provider``) before creating workers.
    """
    if _trace is None:
        return None
    provider = _trace.get_tracer_provider()
    if isinstance(provider, _trace.ProxyTracerProvider | _trace.NoOpTracerProvider):
        return None
    return tracer_from(provider)


def tracer_from(provider: Any) -> Tracer:
    """kirim's tracer from a given ``TracerProvider`` (for ``Worker(tracer=...)``)."""
    from kirim.version import __version__

    return provider.get_tracer(TRACER_NAME, __version__)


def _attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    """OpenTelemetry takes str, bool, int and float values; None is left out."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        out[key] = value if isinstance(value, str | bool | int | float) else str(value)
    return out


def delivery_span(tracer: Tracer, attributes: Mapping[str, Any]) -> AbstractContextManager[Span]:
    """The span of one delivery attempt (one claim), current while it runs."""
    assert _trace is not None
    return tracer.start_as_current_span(  # type: ignore[no-any-return]
        DELIVERY_SPAN, kind=_trace.SpanKind.CONSUMER, attributes=_attributes(attributes)
    )


def request_span(tracer: Tracer, attributes: Mapping[str, Any]) -> AbstractContextManager[Span]:
    """The child span of one provider request."""
    assert _trace is not None
    return tracer.start_as_current_span(  # type: ignore[no-any-return]
        REQUEST_SPAN,
        kind=_trace.SpanKind.CLIENT,
        attributes=_attributes(attributes),
        record_exception=False,
        set_status_on_exception=False,
    )


def annotate(span: Span | None = None, /, **attributes: Any) -> None:
    """Add attributes to ``span`` (default: the current span, i.e. the delivery's)."""
    if _trace is None:
        return
    target = span if span is not None else _trace.get_current_span()
    target.set_attributes(_attributes(attributes))


def fail(span: Span, description: str) -> None:
    """Mark ``span`` as failed (a refused or unanswered provider request)."""
    if _trace is None:
        return
    span.set_status(_trace.Status(_trace.StatusCode.ERROR, description))


__all__ = [
    "AVAILABLE",
    "DELIVERY_SPAN",
    "REQUEST_SPAN",
    "annotate",
    "default_tracer",
    "delivery_span",
    "fail",
    "request_span",
    "tracer_from",
]
