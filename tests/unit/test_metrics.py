"""Prometheus metrics: what the worker and notify() count, and the queue gauges."""

from __future__ import annotations

import asyncio
import re
import socket
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from kirim.cli import main
from kirim.errors import ConfigError
from kirim.model import AttemptStatus, DeliveryStatus, JobStatus, OnUnknown
from kirim.observe.metrics import Metrics
from kirim.store.base import AttemptOutcome, ClaimKind, Finish, Intent
from kirim.testing import Checkpoints, FlakyProvider
from kirim.worker import WorkerSettings

LEASE = 10.0
SETTINGS = WorkerSettings(lease=LEASE, backoff_base=1.0, backoff_max=1.0)
PUSH = {"channel": "push"}


def value(m: Metrics, name: str, **labels: str) -> float:
    """A sample's value, 0 when it was never recorded."""
    return m.registry.get_sample_value(name, labels) or 0.0


async def deliver_all(app, worker, clock, rounds: int = 5) -> None:
    """Run the worker until nothing is left, moving time to each retry."""
    for _ in range(rounds):
        await worker.run_once()
        next_run = await app.store.next_run_at()
        if next_run is None:
            return
        clock.set(max(clock.now(), next_run))


async def test_a_delivery_counts_its_request_latency_and_commit(make_app, clock) -> None:
    """One successful delivery: one request, one latency, one provider-to-commit sample."""
    m = Metrics()
    app = await make_app(FlakyProvider())
    await app.notify("e", "u", "push", {})
    await app.worker(settings=SETTINGS, worker_id="A", metrics=m).run_once()
    ok = {"channel": "push", "result": "success"}
    assert value(m, "kirim_provider_requests_total", **ok) == 1
    assert value(m, "kirim_provider_latency_seconds_count", **ok) == 1
    assert value(m, "kirim_provider_to_commit_seconds_count") == 1
    assert value(m, "kirim_provider_to_commit_seconds_sum") > 0
    assert value(m, "kirim_multi_request_deliveries_total", **PUSH) == 0
    assert value(m, "kirim_retries_total", channel="push", kind="transient") == 0


async def test_retries_are_counted_by_kind_and_multi_requests_once(make_app, clock) -> None:
    """A refusal and an unknown outcome are two retries of two kinds; one delivery, counted once."""
    m = Metrics()
    provider = FlakyProvider(idempotent=True, script=["transient", "ambiguous"])
    app = await make_app(provider)
    n = await app.notify("e", "u", "push", {})
    await deliver_all(app, app.worker(settings=SETTINGS, worker_id="A", metrics=m), clock)
    record = await app.get(n.delivery_id)
    delivery, attempts = record.delivery, record.attempts
    assert delivery.status is DeliveryStatus.SENT
    assert len(attempts) == 3
    assert value(m, "kirim_retries_total", channel="push", kind="transient") == 1
    assert value(m, "kirim_retries_total", channel="push", kind="unknown") == 1
    assert value(m, "kirim_provider_requests_total", channel="push", result="failed_transient") == 1
    assert value(m, "kirim_provider_requests_total", channel="push", result="unknown") == 1
    assert value(m, "kirim_provider_requests_total", channel="push", result="success") == 1
    assert value(m, "kirim_multi_request_deliveries_total", **PUSH) == 1


async def test_enqueue_conflicts_count_the_existing_keys(make_app, clock) -> None:
    """notify() on a key that exists is a unique-key conflict, counted per channel."""
    m = Metrics()
    app = await make_app()
    app.metrics = m
    await app.notify("e", "u", "push", {"a": 1})
    assert value(m, "kirim_enqueue_conflicts_total", **PUSH) == 0
    again = await app.notify("e", "u", "push", {"a": 1})
    assert again.created is False
    assert value(m, "kirim_enqueue_conflicts_total", **PUSH) == 1


async def test_dead_letters_are_counted_per_channel(make_app, clock) -> None:
    """A permanent refusal dead-letters the job and counts it."""
    m = Metrics()
    app = await make_app(FlakyProvider(script=["permanent"]))
    await app.notify("e", "u", "push", {})
    await app.worker(settings=SETTINGS, worker_id="A", metrics=m).run_once()
    assert value(m, "kirim_dead_lettered_total", **PUSH) == 1
    assert value(m, "kirim_provider_requests_total", channel="push", result="failed_permanent") == 1


async def test_expired_leases_are_retries_and_dead_letters_on_the_last_attempt(
    make_app, clock
) -> None:
    """The reaper counts expired leases: a retry of kind lease_expired, or a dead letter."""
    m = Metrics()
    app = await make_app(max_attempts=2)
    n = await app.notify("e", "u", "push", {})
    reaper = app.worker(settings=SETTINGS, worker_id="R", metrics=m)
    for expected_retries in (1, 1):
        (c,) = await app.store.claim(worker_id="gone", now=clock.now(), lease=LEASE, limit=1)
        assert c.delivery.id == n.delivery_id
        clock.advance(LEASE + 1)
        assert await reaper.reap() == 1
        assert value(m, "kirim_retries_total", channel="push", kind="lease_expired") == (
            expected_retries
        )
    assert value(m, "kirim_leases_expired_total") == 2
    assert value(m, "kirim_dead_lettered_total", **PUSH) == 1  # the second, final attempt


async def test_stale_write_and_late_success_are_counted(make_app, clock) -> None:
    """A's success stored after B took over is a stale write and a late success."""
    provider = FlakyProvider(idempotent=True)
    cp = Checkpoints()
    ma, mb = Metrics(), Metrics()
    a, b = await make_app(provider), await make_app(provider)
    wa = a.worker(settings=SETTINGS, worker_id="A", checkpoints=cp, metrics=ma)
    wb = b.worker(settings=SETTINGS, worker_id="B", metrics=mb)
    await a.notify("e", "u", "push", {})
    late = cp.pause("before_commit", worker_id="A")
    task = asyncio.create_task(wa.run_once())
    await late.reached()
    clock.advance(LEASE + 1)
    await wb.run_once()  # reaps A's lease, resends with the same key, commits
    late.release()
    await task
    assert value(ma, "kirim_stale_writes_rejected_total") == 1
    assert value(ma, "kirim_late_successes_total") == 1
    assert value(ma, "kirim_provider_to_commit_seconds_count") == 1  # the late success
    assert value(mb, "kirim_leases_expired_total") == 1
    assert value(mb, "kirim_retries_total", channel="push", kind="lease_expired") == 1
    assert value(mb, "kirim_multi_request_deliveries_total", **PUSH) == 1
    assert value(mb, "kirim_stale_writes_rejected_total") == 0


async def test_a_stale_failure_is_rejected_without_a_late_success(make_app, clock) -> None:
    """A's refusal written after B took over is a stale write, not a late success."""
    provider = FlakyProvider(idempotent=True, script=["transient"])
    cp = Checkpoints()
    m = Metrics()
    a, b = await make_app(provider), await make_app(provider)
    wa = a.worker(settings=SETTINGS, worker_id="A", checkpoints=cp, metrics=m)
    await a.notify("e", "u", "push", {})
    late = cp.pause("before_commit", worker_id="A")
    task = asyncio.create_task(wa.run_once())
    await late.reached()
    clock.advance(LEASE + 1)
    await b.worker(settings=SETTINGS, worker_id="B").run_once()
    late.release()
    await task
    assert value(m, "kirim_stale_writes_rejected_total") == 1
    assert value(m, "kirim_late_successes_total") == 0
    assert value(m, "kirim_retries_total", channel="push", kind="transient") == 0


async def test_gauges_show_statuses_doubt_and_the_due_queue(make_app, clock) -> None:
    """The reaper's refresh sets deliveries by status, in-doubt, queue depth and oldest age."""
    m = Metrics()
    provider = FlakyProvider(idempotent=False, script=["accept_then_timeout", "ok"])
    app = await make_app(provider, on_unknown=OnUnknown.ASSUME_SENT)
    await app.notify("e1", "u", "push", {})  # assumed sent: in doubt
    worker = app.worker(settings=SETTINGS, worker_id="A", metrics=m)
    await worker.run_once()
    await app.notify("e2", "u", "push", {})  # due now
    await app.notify("e3", "u", "push", {})  # due now
    await app.notify("e4", "u", "push", {}, send_after=timedelta(hours=1))  # not due
    clock.advance(7)
    stats = await worker.refresh_stats()
    assert stats is not None
    assert stats.queue_depth == 2
    assert stats.oldest_due_age_s == pytest.approx(7)
    assert value(m, "kirim_queue_depth") == 2
    assert value(m, "kirim_oldest_due_job_age_seconds") == pytest.approx(7)
    assert value(m, "kirim_in_doubt_deliveries") == 1
    assert value(m, "kirim_deliveries", status="sent") == 1
    assert value(m, "kirim_deliveries", status="pending") == 3
    assert m.registry.get_sample_value("kirim_deliveries", {"status": "failed"}) == 0


async def test_queue_stats_of_an_empty_store(make_app, clock) -> None:
    """An empty store has every status at zero and no due job."""
    app = await make_app()
    stats = await app.store.queue_stats(now=clock.now())
    assert set(stats.deliveries) == {s.value for s in DeliveryStatus}
    assert sum(stats.deliveries.values()) == 0
    assert (stats.in_doubt, stats.queue_depth, stats.oldest_due_age_s) == (0, 0, 0.0)


async def test_held_deliveries_count_as_in_doubt(make_app, clock) -> None:
    """A delivery parked in_doubt by the hold policy is in the in-doubt gauge."""
    provider = FlakyProvider(idempotent=False, script=["accept_then_timeout"])
    app = await make_app(provider, on_unknown=OnUnknown.HOLD)
    await app.notify("e", "u", "push", {})
    await app.worker(settings=SETTINGS, worker_id="A").run_once()
    stats = await app.store.queue_stats(now=clock.now())
    assert stats.deliveries["in_doubt"] == 1
    assert stats.in_doubt == 1


async def test_claims_report_the_requests_already_made(make_app, clock) -> None:
    """A claim says how many attempt rows its delivery already had."""
    app = await make_app()
    n = await app.notify("e", "u", "push", {})
    (c,) = await app.store.claim(worker_id="w", now=clock.now(), lease=LEASE, limit=1)
    assert (c.kind, c.prior_requests) == (ClaimKind.CLAIMED, 0)
    intent = Intent(
        delivery_id=n.delivery_id,
        job_id=c.job.id,
        token=c.token,
        number=1,
        provider_request_id="req-1",
        worker_id="w",
        requested_at=clock.now(),
    )
    assert await app.store.record_intents([intent]) == [True]
    outcome = AttemptOutcome(
        provider_request_id="req-1",
        status=AttemptStatus.FAILED_TRANSIENT,
        provider_message_id=None,
        error="refused",
        completed_at=clock.now(),
    )
    (done,) = await app.store.finish(
        [
            Finish(
                delivery_id=n.delivery_id,
                job_id=c.job.id,
                token=c.token,
                now=clock.now(),
                attempt=outcome,
                delivery_status=DeliveryStatus.PENDING,
                job_status=JobStatus.RETRY_SCHEDULED,
                run_at=clock.now(),
            )
        ]
    )
    assert done.committed
    (again,) = await app.store.claim(worker_id="w", now=clock.now(), lease=LEASE, limit=1)
    assert (again.kind, again.prior_requests, again.doubtful) == (ClaimKind.CLAIMED, 1, ())


def test_two_metrics_objects_do_not_collide() -> None:
    """Each Metrics has its own registry: two in one process count apart."""
    a, b = Metrics(), Metrics()
    a.enqueue_conflict("push")
    assert value(a, "kirim_enqueue_conflicts_total", **PUSH) == 1
    assert value(b, "kirim_enqueue_conflicts_total", **PUSH) == 0


def test_render_is_the_text_exposition() -> None:
    """render() gives every metric with its HELP and TYPE lines."""
    m = Metrics()
    m.provider_response("push", AttemptStatus.SUCCEEDED, 0.02)
    text = m.render().decode()
    for name, kind in [
        ("kirim_retries", "counter"),
        ("kirim_enqueue_conflicts", "counter"),
        ("kirim_provider_to_commit_seconds", "histogram"),
        ("kirim_provider_latency_seconds", "histogram"),
        ("kirim_provider_requests", "counter"),
        ("kirim_multi_request_deliveries", "counter"),
        ("kirim_deliveries", "gauge"),
        ("kirim_in_doubt_deliveries", "gauge"),
        ("kirim_queue_depth", "gauge"),
        ("kirim_oldest_due_job_age_seconds", "gauge"),
        ("kirim_leases_expired", "counter"),
        ("kirim_stale_writes_rejected", "counter"),
        ("kirim_late_successes", "counter"),
        ("kirim_dead_lettered", "counter"),
    ]:
        assert re.search(rf"^# TYPE {name}(_total)? {kind}$", text, re.MULTILINE), name
    assert 'kirim_provider_requests_total{channel="push",result="success"} 1.0' in text


def test_serve_exposes_metrics_on_loopback() -> None:
    """serve() answers /metrics on 127.0.0.1 and close() stops it."""
    m = Metrics()
    port = m.serve(0)
    try:
        m.queue_depth.set(3)
        answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert answer.status_code == 200
        assert "kirim_queue_depth 3.0" in answer.text
    finally:
        m.close()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)


def test_serve_on_a_busy_port_is_a_config_error() -> None:
    """A port already taken gives a ConfigError naming the option to change."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigError, match="--metrics-port"):
            Metrics().serve(taken.getsockname()[1])


def test_worker_command_serves_metrics(tmp_path: Path) -> None:
    """`kirim worker --burst --metrics-port 0` starts, drains an empty queue and exits 0."""
    config = tmp_path / "kirim.toml"
    config.write_text('[channels.push]\nurl = "http://127.0.0.1:9/push"\n')
    args = ["--config", str(config), "--database", f"sqlite:///{tmp_path / 'k.db'}"]
    runner = CliRunner()
    assert runner.invoke(main, [*args, "init"]).exit_code == 0
    done = runner.invoke(main, [*args, "worker", "--burst", "--metrics-port", "0"])
    assert done.exit_code == 0, done.output
    assert "metrics_serving" in done.output


def test_worker_command_refuses_a_busy_metrics_port(tmp_path: Path) -> None:
    """A busy --metrics-port exits 2 with a one-line message."""
    config = tmp_path / "kirim.toml"
    config.write_text('[channels.push]\nurl = "http://127.0.0.1:9/push"\n')
    args = ["--config", str(config), "--database", f"sqlite:///{tmp_path / 'k.db'}"]
    runner = CliRunner()
    assert runner.invoke(main, [*args, "init"]).exit_code == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = runner.invoke(main, [*args, "worker", "--burst", "--metrics-port", port])
    assert done.exit_code == 2
    assert "cannot serve metrics" in done.output
