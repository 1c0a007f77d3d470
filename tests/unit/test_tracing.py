"""OpenTelemetry spans: one per delivery attempt, one child per provider request."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from kirim.observe import tracing
from kirim.testing import Checkpoints, FlakyProvider
from kirim.worker import Worker, WorkerSettings

LEASE = 10.0
SETTINGS = WorkerSettings(lease=LEASE, backoff_base=1.0, backoff_max=1.0)
CORRELATION = {"notification_id", "event_id", "job_id", "attempt", "worker_id", "idempotency_key"}


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Spans finished by a private SDK provider (the global one is left alone)."""
    found = InMemorySpanExporter()
    yield found
    found.clear()


@pytest.fixture
def tracer(exporter: InMemorySpanExporter):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield tracing.tracer_from(provider)
    provider.shutdown()


def traced_worker(app, tracer, clock, worker_id: str = "A", **kw) -> Worker:
    return Worker(
        app.store,
        app.channels(),
        settings=SETTINGS,
        worker_id=worker_id,
        clock=clock,
        tracer=tracer,
        **kw,
    )


def spans_by_name(exporter: InMemorySpanExporter, name: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def test_a_delivery_is_a_span_with_a_provider_request_child(
    make_app, clock, tracer, exporter
) -> None:
    """The delivery span parents the request span; both carry the log's correlation fields."""
    app = await make_app(FlakyProvider())
    n = await app.notify("48291", "1007", "push", {"t": 1})
    await traced_worker(app, tracer, clock).run_once()
    (delivery,) = spans_by_name(exporter, tracing.DELIVERY_SPAN)
    (request,) = spans_by_name(exporter, tracing.REQUEST_SPAN)
    assert request.parent is not None
    assert request.parent.span_id == delivery.context.span_id
    assert request.context.trace_id == delivery.context.trace_id
    assert (delivery.kind, request.kind) == (SpanKind.CONSUMER, SpanKind.CLIENT)
    for span in (delivery, request):
        assert set(span.attributes) >= CORRELATION | {"provider_request_id"}
        assert span.attributes["notification_id"] == n.delivery_id
        assert span.attributes["event_id"] == "48291"
        assert span.attributes["idempotency_key"] == n.idempotency_key
        assert span.attributes["worker_id"] == "A"
        assert span.attributes["attempt"] == 1
    assert request.attributes["provider_request_id"].startswith("req-")
    assert delivery.attributes["provider_request_id"] == request.attributes["provider_request_id"]
    assert request.attributes["result"] == "success"
    assert request.attributes["provider_message_id"].startswith("p-")
    assert request.status.status_code is StatusCode.UNSET
    assert delivery.attributes["outcome"] == "committed"
    assert delivery.attributes["status"] == "sent"
    assert delivery.attributes["job_status"] == "completed"


async def test_a_refused_request_is_an_error_span_and_a_retry(
    make_app, clock, tracer, exporter
) -> None:
    """A transient refusal marks the request span failed; the delivery span says retry."""
    app = await make_app(FlakyProvider(script=["transient"]))
    await app.notify("e", "u", "push", {})
    await traced_worker(app, tracer, clock).run_once()
    (delivery,) = spans_by_name(exporter, tracing.DELIVERY_SPAN)
    (request,) = spans_by_name(exporter, tracing.REQUEST_SPAN)
    assert request.attributes["result"] == "failed_transient"
    assert "refused" in request.attributes["error"]
    assert request.status.status_code is StatusCode.ERROR
    assert delivery.attributes["status"] == "pending"
    assert delivery.attributes["job_status"] == "retry_scheduled"


async def test_a_late_success_is_the_outcome_of_the_stale_worker(
    make_app, clock, tracer, exporter
) -> None:
    """A's success stored after B took over: A's delivery span says late_success."""
    provider = FlakyProvider(idempotent=True)
    cp = Checkpoints()
    a, b = await make_app(provider), await make_app(provider)
    wa = traced_worker(a, tracer, clock, "A", checkpoints=cp)
    await a.notify("e", "u", "push", {})
    late = cp.pause("before_commit", worker_id="A")
    task = asyncio.create_task(wa.run_once())
    await late.reached()
    clock.advance(LEASE + 1)
    await traced_worker(b, tracer, clock, "B").run_once()
    late.release()
    await task
    outcomes = {
        s.attributes["worker_id"]: s.attributes["outcome"]
        for s in spans_by_name(exporter, tracing.DELIVERY_SPAN)
    }
    assert outcomes == {"A": "late_success", "B": "committed"}
    requests = spans_by_name(exporter, tracing.REQUEST_SPAN)
    assert sorted(s.attributes["attempt"] for s in requests) == [1, 2]


async def test_a_lost_claim_is_the_outcome_before_any_request(
    make_app, clock, tracer, exporter
) -> None:
    """A stalls after its claim, B takes over: A's span says claim_lost and has no child."""
    provider = FlakyProvider()
    cp = Checkpoints()
    a, b = await make_app(provider), await make_app(provider)
    wa = traced_worker(a, tracer, clock, "A", checkpoints=cp)
    await a.notify("e", "u", "push", {})
    stall = cp.pause("after_claim", worker_id="A")
    task = asyncio.create_task(wa.run_once())
    await stall.reached()
    clock.advance(LEASE + 1)
    await b.worker(settings=SETTINGS, worker_id="B").run_once()
    stall.release()
    await task
    (span,) = spans_by_name(exporter, tracing.DELIVERY_SPAN)
    assert span.attributes["outcome"] == "claim_lost"
    assert spans_by_name(exporter, tracing.REQUEST_SPAN) == []


async def test_without_an_sdk_provider_the_worker_makes_no_spans(make_app, clock) -> None:
    """With only the API (no SDK provider set), the worker holds no tracer at all."""
    app = await make_app(FlakyProvider())
    assert tracing.AVAILABLE
    assert tracing.default_tracer() is None
    worker = app.worker(settings=SETTINGS)
    assert worker._tracer is None
    assert worker._deliverer.context.spans is tracing.NO_SPANS  # its methods do nothing


def test_without_the_extra_nothing_is_imported_or_called(tmp_path) -> None:
    """With opentelemetry missing, tracing is off and a worker still delivers."""
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        sys.modules["opentelemetry"] = None  # as if the extra were not installed
        from kirim.channels import Channel
        from kirim.config import Config
        from kirim.engine import Kirim
        from kirim.observe import tracing
        from kirim.testing import FlakyProvider

        async def main():
            channels = {{"push": Channel(name="push", provider=FlakyProvider())}}
            app = Kirim(Config(database="sqlite:///{tmp_path / "k.db"}"), channels=channels)
            await app.open(migrate=True)
            await app.notify("e", "u", "push", {{}})
            worker = app.worker()
            assert worker._tracer is None
            await worker.run_once()
            assert worker.stats.sent == 1
            await app.close()

        assert tracing.AVAILABLE is False and tracing.default_tracer() is None
        asyncio.run(main())
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "ok"
