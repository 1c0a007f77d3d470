"""OpenTelemetry spans for deliveries, when ``opentelemetry-api`` is installed.

``pip install 'kirim[otel]'`` and configure an SDK (exporter, sampler) as usual:
each delivery attempt becomes a ``kirim.delivery`` span and each provider request a
child ``kirim.provider_request`` span, with the same correlation attributes as the
log lines (``notification_id``, ``event_id``, ``job_id``, ``attempt``,
``worker_id``, ``idempotency_key``, ``provider_request_id``) and the outcome.

The import is tried once, here. The worker talks to a ``Spans``: ``spans_for`` gives
``OtelSpans`` over a tracer, or, without the package (or while no SDK tracer
provider is configured, when ``default_tracer()`` is None), ``NO_SPANS``, whose
methods do nothing and allocate nothing: the worker calls it unconditionally and
nothing of OpenTelemetry is called on its hot path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol

from kirim.observe import RESULT

if TYPE_CHECKING:
    from kirim.model import AttemptStatus
    from kirim.providers.base import Message, Sent
    from kirim.store.base import Claim, FinishResult

    #: a classified provider answer: its status, what it sent back, the failure
    Answer = tuple[AttemptStatus, Sent | None, Exception | None]
    #: one delivery's protocol, given its claim
    Run = Callable[[Claim], Coroutine[Any, Any, None]]

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

#: how a delivery span ended (its ``outcome`` attribute)
Outcome = Literal[
    "noop",  # the delivery was already final
    "busy",  # another worker holds its claim
    "claim_lost",  # the intent was refused: the claim token no longer held
    "committed",
    "late_success",  # a success stored after the claim was lost
    "stale_write_rejected",
    "commit_failed",  # the store refused the commit five times
    "error",  # a bug or a store failure: the lease will expire
]


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


# -- what the worker calls ------------------------------------------------------------


class Spans(Protocol):
    """What the worker tells its tracer, at four points of one delivery's protocol."""

    def delivery(self, claim: Claim, worker_id: str, run: Run) -> Coroutine[Any, Any, None]:
        """``run(claim)`` (the delivery of ``claim``) inside its delivery span."""

    def request(
        self, job_id: int, worker_id: str, message: Message, call: Awaitable[Answer]
    ) -> Awaitable[Answer]:
        """``call`` (the provider request of ``message``) inside its request span; it
        is awaited at once (the caller awaits what this returns right away)."""

    def outcome(
        self, outcome: Outcome, reason: str | None = None, error: str | None = None
    ) -> None:
        """How the current delivery ended, when it ended before its commit."""

    def committed(self, result: FinishResult) -> None:
        """What the commit of the current delivery did."""


class NoSpans:
    """Tracing off: every method returns what it was given, or nothing."""

    __slots__ = ()

    def delivery(self, claim: Claim, worker_id: str, run: Run) -> Coroutine[Any, Any, None]:
        return run(claim)

    def request(
        self, job_id: int, worker_id: str, message: Message, call: Awaitable[Answer]
    ) -> Awaitable[Answer]:
        return call

    def outcome(
        self, outcome: Outcome, reason: str | None = None, error: str | None = None
    ) -> None:
        return None

    def committed(self, result: FinishResult) -> None:
        return None


#: the one ``NoSpans``
NO_SPANS = NoSpans()


class OtelSpans:
    """Spans on an OpenTelemetry tracer: a delivery span per claim, a child per request."""

    __slots__ = ("tracer",)

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    async def delivery(self, claim: Claim, worker_id: str, run: Run) -> None:
        d, job = claim.delivery, claim.job
        attributes = {
            "notification_id": d.id,
            "event_id": d.event_id,
            "job_id": job.id,
            "attempt": job.attempts,
            "worker_id": worker_id,
            "idempotency_key": d.idempotency_key,
            "channel": d.channel,
            "claim": str(claim.kind),
        }
        with delivery_span(self.tracer, attributes):
            await run(claim)

    async def request(
        self, job_id: int, worker_id: str, message: Message, call: Awaitable[Answer]
    ) -> Answer:
        attributes = {
            "notification_id": message.delivery_id,
            "event_id": message.event_id,
            "job_id": job_id,
            "attempt": message.attempt,
            "worker_id": worker_id,
            "idempotency_key": message.idempotency_key,
            "provider_request_id": message.provider_request_id,
            "channel": message.channel,
        }
        with request_span(self.tracer, attributes) as span:
            status, sent, error = await call
            annotate(
                span,
                result=RESULT[status],
                provider_message_id=None if sent is None else sent.provider_message_id,
                error=None if error is None else str(error),
            )
            if error is not None:
                fail(span, f"{RESULT[status]}: {error}")
        annotate(provider_request_id=message.provider_request_id)
        return status, sent, error

    def outcome(
        self, outcome: Outcome, reason: str | None = None, error: str | None = None
    ) -> None:
        annotate(outcome=outcome, reason=reason, error=error)

    def committed(self, result: FinishResult) -> None:
        annotate(
            outcome=_outcome(result),
            status=None if result.delivery_status is None else str(result.delivery_status),
            job_status=None if result.job_status is None else str(result.job_status),
        )


def _outcome(result: FinishResult) -> Outcome:
    """What a commit did, for the delivery span."""
    if result.committed:
        return "committed"
    return "late_success" if result.late_success else "stale_write_rejected"


def spans_for(tracer: Tracer | None) -> Spans:
    """``OtelSpans`` over ``tracer``; ``NO_SPANS`` for None (tracing off)."""
    return NO_SPANS if tracer is None else OtelSpans(tracer)


__all__ = [
    "AVAILABLE",
    "DELIVERY_SPAN",
    "NO_SPANS",
    "REQUEST_SPAN",
    "NoSpans",
    "OtelSpans",
    "Outcome",
    "Spans",
    "annotate",
    "default_tracer",
    "delivery_span",
    "fail",
    "request_span",
    "spans_for",
    "tracer_from",
]
