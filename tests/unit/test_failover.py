"""Failover: a delivery moves to a fallback channel only after a definite
non-acceptance, read from the ledger; after an uncertain outcome it stays with the
provider that may have it (docs/channels.md, "How failover decides")."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kirim.channels import Channel
from kirim.config import Config, parse_config
from kirim.engine import Kirim
from kirim.model import Attempt, AttemptStatus, DeliveryStatus, Doubt, JobStatus, OnUnknown
from kirim.observe.logging import configure
from kirim.observe.metrics import Metrics
from kirim.providers.base import Message
from kirim.testing import Checkpoints, FlakyProvider, ManualClock, WorkerCrashed
from kirim.timeline import events
from kirim.views import attempt_json
from kirim.worker import Worker, WorkerSettings
from kirim.worker.decisions import Route, route

LEASE = 10.0
SETTINGS = WorkerSettings(lease=LEASE, backoff_base=1.0, backoff_max=4.0)
HANG = "hang"  # accept the request, then never answer (the client times out)


# -- a scripted provider on 127.0.0.1 ---------------------------------------------------


class Endpoint:
    """A webhook endpoint that answers its ``script`` in order (then 200), recording
    every request; ``HANG`` reads the request and never answers."""

    def __init__(self, script: list[int | str]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, str]] = []
        self.release = threading.Event()
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                with endpoint.lock:
                    endpoint.requests.append(dict(self.headers))
                    answer = endpoint.script.pop(0) if endpoint.script else 200
                if answer == HANG:
                    endpoint.release.wait(5)
                    return
                assert isinstance(answer, int)
                body = json.dumps({"id": f"m-{len(endpoint.requests)}"}).encode()
                self.send_response(answer)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,))
        self.thread.daemon = True
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/notify"

    def keys(self) -> list[str]:
        return [r["Idempotency-Key"] for r in self.requests]

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint() -> Iterator[Callable[..., Endpoint]]:
    made: list[Endpoint] = []

    def make(*script: int | str) -> Endpoint:
        made.append(Endpoint(list(script)))
        return made[-1]

    yield make
    for e in made:
        e.stop()


@pytest.fixture
def captured_logs() -> Iterator[io.StringIO]:
    out = io.StringIO()
    configure(fmt="json", level="info", stream=out)
    yield out
    configure(level="warning")


def closed_url() -> str:
    """A loopback URL nobody listens on: connection refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/notify"


@pytest.fixture
async def open_app(database_url: str, clock: ManualClock) -> AsyncIterator[Callable[..., Any]]:
    """Apps on the test's database, with channels from a config or given directly."""
    apps: list[Kirim] = []

    async def make(
        channels: dict[str, Any], *, max_attempts: int = 6, direct: bool = False
    ) -> Kirim:
        if direct:
            config = Config(database=database_url, max_attempts=max_attempts)
            app = Kirim(config, channels=channels, clock=clock)
        else:
            data = {"worker": {"max_attempts": max_attempts}, "channels": channels}
            app = Kirim(parse_config(data, database=database_url), clock=clock)
        await app.open(migrate=True)
        apps.append(app)
        return app

    yield make
    for app in apps:
        await app.close()


def webhooks(primary: str, backup: str, **backup_options: Any) -> dict[str, Any]:
    """A ``push`` channel that falls back to ``backup``."""
    return {
        "push": {"url": primary, "timeout": 0.3, "idempotent": True, "fallback": ["backup"]},
        "backup": {"url": backup, "timeout": 0.3, **backup_options},
    }


async def run(
    app: Kirim, worker: Worker, clock: ManualClock, delivery_id: int, rounds: int
) -> None:
    """Run the worker ``rounds`` times, moving the clock to each scheduled retry."""
    for _ in range(rounds):
        await worker.run_once()
        job = await app.store.get_job(delivery_id)
        if job is None or job.status is not JobStatus.RETRY_SCHEDULED:
            return
        clock.set(max(clock.now(), job.run_at))


def providers(attempts: list[Attempt]) -> list[str | None]:
    return [a.provider for a in attempts]


# -- real HTTP providers -------------------------------------------------------------


async def test_connection_refused_on_the_primary_goes_to_the_fallback(
    open_app, endpoint, clock
) -> None:
    """Nobody listens at the primary: the fallback gets one request, and it is sent."""
    backup = endpoint()
    app = await open_app(webhooks(closed_url(), backup.url))
    n = await app.notify("48291", "1007", "push", {"title": "shipped"})
    registry = CollectorRegistry()
    worker = app.worker(settings=SETTINGS, worker_id="A", metrics=Metrics(registry))
    await worker.run_once()
    job = await app.store.get_job(n.delivery_id)
    assert job.status is JobStatus.RETRY_SCHEDULED
    assert job.run_at <= clock.now()  # the next provider at once: no backoff
    await worker.run_once()

    rec = await app.get(n.delivery_id)
    delivery, job, attempts = rec.delivery, rec.job, rec.attempts
    assert delivery.status is DeliveryStatus.SENT
    assert delivery.doubt is None
    assert providers(attempts) == ["push", "backup"]
    assert [a.status for a in attempts] == [
        AttemptStatus.FAILED_TRANSIENT,
        AttemptStatus.SUCCEEDED,
    ]
    assert backup.keys() == [n.idempotency_key]
    assert (
        registry.get_sample_value("kirim_failovers_total", {"channel": "push", "to": "backup"}) == 1
    )


async def test_a_permanent_refusal_401_on_the_primary_goes_to_the_fallback(
    open_app, endpoint, clock
) -> None:
    """The primary answers 401 (this provider will not take it): the fallback sends it."""
    primary, backup = endpoint(401), endpoint()
    app = await open_app(webhooks(primary.url, backup.url))
    n = await app.notify("48291", "1007", "push", {"title": "shipped"})
    await run(app, app.worker(settings=SETTINGS, worker_id="A"), clock, n.delivery_id, 4)

    rec = await app.get(n.delivery_id)
    delivery, attempts = rec.delivery, rec.attempts
    assert delivery.status is DeliveryStatus.SENT
    assert providers(attempts) == ["push", "backup"]
    assert attempts[0].status is AttemptStatus.FAILED_PERMANENT
    assert len(primary.requests) == 1
    assert backup.keys() == [n.idempotency_key]


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "hold"])
async def test_an_ambiguous_outcome_on_the_primary_never_reaches_the_fallback(
    open_app, endpoint, clock, idempotent
) -> None:
    """The primary takes the request and never answers: no request to the fallback,
    ever; the primary's in-doubt policy decides (a resend with the same key to the
    primary when it honours keys, else held for an operator)."""
    primary, backup = endpoint(HANG, 500, 200), endpoint()
    channels = webhooks(primary.url, backup.url)
    channels["push"].update(idempotent=idempotent, on_unknown="hold")
    app = await open_app(channels)
    n = await app.notify("48291", "1007", "push", {"title": "shipped"})
    await run(app, app.worker(settings=SETTINGS, worker_id="A"), clock, n.delivery_id, 6)

    rec = await app.get(n.delivery_id)
    delivery, attempts = rec.delivery, rec.attempts
    assert backup.requests == []
    assert set(providers(attempts)) == {"push"}
    if idempotent:  # unknown, then 500 (unknown again), then 200: all to the primary
        assert delivery.status is DeliveryStatus.SENT
        assert primary.keys() == [n.idempotency_key] * 3
    else:
        assert delivery.status is DeliveryStatus.IN_DOUBT
        assert delivery.doubt is Doubt.HELD
        assert primary.keys() == [n.idempotency_key]


async def test_the_fallback_refusing_for_good_fails_the_delivery(open_app, endpoint, clock) -> None:
    """Both refuse for good (401, then 403): failed, dead, one request each."""
    primary, backup = endpoint(401), endpoint(403)
    app = await open_app(webhooks(primary.url, backup.url))
    n = await app.notify("48291", "1007", "push", {"title": "shipped"})
    await run(app, app.worker(settings=SETTINGS, worker_id="A"), clock, n.delivery_id, 4)

    rec = await app.get(n.delivery_id)
    delivery, job, attempts = rec.delivery, rec.job, rec.attempts
    assert delivery.status is DeliveryStatus.FAILED
    assert job.status is JobStatus.DEAD
    assert providers(attempts) == ["push", "backup"]
    assert (len(primary.requests), len(backup.requests)) == (1, 1)


async def test_the_status_and_timeline_show_each_attempts_provider(
    open_app, endpoint, clock
) -> None:
    """The JSON of every attempt names its provider; the timeline says provider= on
    the request and response lines of a delivery that failed over."""
    backup = endpoint()
    app = await open_app(webhooks(closed_url(), backup.url))
    n = await app.notify("48291", "1007", "push", {"title": "shipped"})
    await run(app, app.worker(settings=SETTINGS, worker_id="A"), clock, n.delivery_id, 3)
    record = await app.get(n.delivery_id)

    assert [attempt_json(a)["provider"] for a in record.attempts] == ["push", "backup"]
    lines = [e.line for e in events(record, now=clock.now())]
    requests = [line for line in lines if "action=provider_request" in line]
    responses = [line for line in lines if "action=provider_response" in line]
    assert ["provider=push" in requests[0], "provider=backup" in requests[1]] == [True, True]
    assert ["provider=push" in responses[0], "provider=backup" in responses[1]] == [True, True]


def test_kirim_status_shows_the_provider_of_each_attempt(tmp_path, endpoint) -> None:
    """`kirim status` (text and --json) shows where each attempt went."""
    from click.testing import CliRunner

    from kirim.cli import main

    backup = endpoint()
    config = tmp_path / "kirim.toml"
    config.write_text(
        f'[channels.push]\nurl = "{closed_url()}"\ntimeout = 1\nfallback = ["backup"]\n\n'
        f'[channels.backup]\nurl = "{backup.url}"\ntimeout = 1\n'
    )
    base = ["--config", str(config), "--database", f"sqlite:///{tmp_path / 'k.db'}"]

    def kirim(*args: str) -> str:
        runner = CliRunner(env={"COLUMNS": "400"})  # one timeline row per line
        result = runner.invoke(main, [*base, *args], catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
        return result.stdout

    kirim("init")
    kirim("send", "--event", "e1", "--recipient", "u1", "--channel", "push", "--payload", "{}")
    kirim("worker", "--burst")
    shown = json.loads(kirim("status", "1", "--json"))
    assert shown["status"] == "sent"
    assert [a["provider"] for a in shown["attempts"]] == ["push", "backup"]
    rows = [line for line in kirim("status", "1").splitlines() if "request_id=" in line]
    assert len(rows) == 4  # two requests, two answers
    assert ["provider=push" in r for r in rows] == [True, True, False, False]
    assert ["provider=backup" in r for r in rows] == [False, False, True, True]
    assert len(backup.requests) == 1


# -- the ledger decides: a crash after the intent to the fallback --------------------


@pytest.mark.parametrize("where", ["before_request", "in_flight"])
@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "at_least_once"])
async def test_a_crash_after_the_intent_to_the_fallback_resumes_at_the_fallback(
    open_app, clock, where, idempotent
) -> None:
    """A dies after its intent to the fallback was written (before the request left,
    or with it at the fallback and no answer): B, a fresh worker, sends to the
    fallback only; the primary never sees a second request."""
    primary = FlakyProvider(idempotent=True, script=["transient"])
    backup = FlakyProvider(idempotent=idempotent)
    channels = {
        "push": Channel(name="push", provider=primary, fallback=("backup",)),
        "backup": Channel(name="backup", provider=backup, on_unknown=OnUnknown.RETRY),
    }
    app = await open_app(channels, direct=True)
    other = await open_app(channels, direct=True)
    cp = Checkpoints()
    wa = app.worker(settings=SETTINGS, worker_id="A", checkpoints=cp)
    wb = other.worker(settings=SETTINGS, worker_id="B")
    n = await app.notify("48291", "1007", "push", {"title": "shipped"})
    await wa.run_once()  # the primary refuses: the next attempt goes to the fallback
    if where == "before_request":
        cp.pause("before_provider_request", worker_id="A").crash()
    else:

        async def die(_: Message) -> None:
            raise WorkerCrashed("SIGKILL while waiting for the answer")

        backup.on_request = die
    await wa.run_once()
    backup.on_request = None
    attempts = (await app.get(n.delivery_id)).attempts
    assert providers(attempts) == ["push", "backup"]
    assert attempts[1].status is AttemptStatus.REQUESTED  # the intent survived the crash

    clock.advance(LEASE + 1)
    await run(other, wb, clock, n.delivery_id, 3)
    rec = await app.get(n.delivery_id)
    delivery, attempts = rec.delivery, rec.attempts
    assert delivery.status is DeliveryStatus.SENT
    assert providers(attempts) == ["push", "backup", "backup"]
    assert primary.received(n.idempotency_key) == 1
    arrived = 1 if where == "in_flight" else 0
    assert backup.received(n.idempotency_key) == arrived + 1
    if idempotent:
        assert backup.effective(n.idempotency_key) == 1


# -- the rule, with in-process providers ---------------------------------------------


async def test_transient_refusals_walk_the_chain_then_back_off_and_start_over(
    open_app, clock
) -> None:
    """A refuses for now, B refuses for now: a backoff, then A again; B was tried at once."""
    a = FlakyProvider(script=["transient", "ok"])
    b = FlakyProvider(script=["transient"])
    channels = {
        "push": Channel(name="push", provider=a, fallback=("backup",)),
        "backup": Channel(name="backup", provider=b),
    }
    app = await open_app(channels, direct=True)
    n = await app.notify("e", "u", "push", {})
    worker = app.worker(settings=SETTINGS, worker_id="A")
    started = clock.now()
    await worker.run_once()
    await worker.run_once()  # no backoff before the fallback: due at once
    job = await app.store.get_job(n.delivery_id)
    assert job.status is JobStatus.RETRY_SCHEDULED
    assert job.attempts == 2
    assert clock.now() == started
    await run(app, worker, clock, n.delivery_id, 3)
    rec = await app.get(n.delivery_id)
    delivery, attempts = rec.delivery, rec.attempts
    assert delivery.status is DeliveryStatus.SENT
    assert providers(attempts) == ["push", "backup", "push"]


async def test_a_fallback_that_refuses_for_now_after_the_primary_refused_for_good(
    open_app, clock
) -> None:
    """A refuses for good, B refuses for now: B is retried with backoff, A never again."""
    a = FlakyProvider(script=["permanent"])
    b = FlakyProvider(script=["transient", "transient"])
    channels = {
        "push": Channel(name="push", provider=a, fallback=("backup",)),
        "backup": Channel(name="backup", provider=b),
    }
    app = await open_app(channels, direct=True)
    n = await app.notify("e", "u", "push", {})
    await run(app, app.worker(settings=SETTINGS, worker_id="A"), clock, n.delivery_id, 6)
    rec = await app.get(n.delivery_id)
    delivery, attempts = rec.delivery, rec.attempts
    assert delivery.status is DeliveryStatus.SENT
    assert providers(attempts) == ["push", "backup", "backup", "backup"]
    assert a.received(n.idempotency_key) == 1


async def test_an_unknown_outcome_at_the_fallback_keeps_the_delivery_there(open_app, clock) -> None:
    """Once the fallback may have it, every later attempt goes to the fallback, even
    when it then refuses for now."""
    a = FlakyProvider(script=["transient"])
    b = FlakyProvider(script=["accept_then_timeout", "transient", "ok"])
    channels = {
        "push": Channel(name="push", provider=a, fallback=("backup",)),
        "backup": Channel(name="backup", provider=b),
    }
    app = await open_app(channels, direct=True)
    n = await app.notify("e", "u", "push", {})
    await run(app, app.worker(settings=SETTINGS, worker_id="A"), clock, n.delivery_id, 6)
    rec = await app.get(n.delivery_id)
    delivery, attempts = rec.delivery, rec.attempts
    assert delivery.status is DeliveryStatus.SENT
    assert providers(attempts) == ["push", "backup", "backup", "backup"]
    assert a.received(n.idempotency_key) == 1
    assert b.effective(n.idempotency_key) == 1


def attempt(i: int, provider: str | None, status: AttemptStatus) -> Attempt:
    return Attempt(
        id=i,
        delivery_id=1,
        job_id=1,
        number=i,
        provider_request_id=f"r{i}",
        worker_id="w",
        status=status,
        provider_message_id=None,
        error=None,
        requested_at=float(i),
        completed_at=None if status.in_doubt else float(i),
        provider=provider,
    )


T, P, U, R = (
    AttemptStatus.FAILED_TRANSIENT,
    AttemptStatus.FAILED_PERMANENT,
    AttemptStatus.UNKNOWN,
    AttemptStatus.REQUESTED,
)


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        ([], Route("a", "first")),
        ([("a", T)], Route("b", "failover", "a")),
        ([("a", P)], Route("b", "failover", "a")),
        ([("a", T), ("b", T)], Route("c", "failover", "b")),
        ([("a", P), ("b", P)], Route("c", "failover", "b")),
        ([("a", T), ("b", T), ("c", T)], Route("a", "again", "c")),
        ([("a", P), ("b", T), ("c", T)], Route("b", "again", "c")),
        ([("a", T), ("b", P), ("c", T)], Route("a", "again", "c")),
        ([("a", T), ("b", T), ("c", T), ("a", T)], Route("b", "failover", "a")),
        ([("a", T), ("b", P), ("c", T), ("a", T)], Route("c", "failover", "a")),
        ([("a", U)], Route("a", "pinned")),
        ([("a", T), ("b", R)], Route("b", "pinned")),
        ([("a", T), ("b", U), ("b", T)], Route("b", "pinned")),
        ([("a", T), ("b", U), ("b", P)], Route("b", "pinned")),
        ([(None, T)], Route("b", "failover", "a")),  # written before schema 6: "a"
        ([(None, U)], Route("a", "pinned")),
        ([("gone", T)], Route("a", "failover", "gone")),  # no longer in the chain
    ],
)
def test_the_route_is_read_from_the_attempts(history, expected) -> None:
    """Failover after a definite refusal, pinned after an uncertain outcome, the chain
    started over after its end refused for now."""
    attempts = [attempt(i + 1, p, s) for i, (p, s) in enumerate(history)]
    doubtful = [x for x in attempts if x.status.in_doubt]
    assert route(("a", "b", "c"), attempts, doubtful) == expected


def test_the_explorers_invariant_finds_a_second_provider_after_doubt() -> None:
    """one_provider_in_doubt: an attempt to another provider after one that may have
    arrived is a violation; after a definite refusal it is not."""
    from kirim.explore.invariants import _one_provider

    def rows(*pairs: tuple[str, str]) -> list[dict[str, object]]:
        return [
            {"id": i, "provider": p, "status": s, "provider_request_id": f"r{i}"}
            for i, (p, s) in enumerate(pairs, 1)
        ]

    assert _one_provider(1, rows(("a", "failed_transient"), ("b", "succeeded"))) == []
    assert _one_provider(1, rows(("a", "unknown"), ("a", "succeeded"))) == []
    [found] = _one_provider(1, rows(("a", "unknown"), ("b", "succeeded")))
    assert found.name == "one_provider_in_doubt"
    assert "went to b after r1 to a" in found.detail


async def test_a_permanent_refusal_at_the_chains_end_goes_back_to_one_refused_for_now(
    open_app, clock
) -> None:
    """A refuses for now, its fallback B refuses for good: A again after a backoff, not
    a dead letter (explorer finding: full workload seeds 140, 277, 465; on main the
    delivery failed with attempts left)."""
    a = FlakyProvider(script=["transient"])
    b = FlakyProvider(script=["permanent"])
    channels = {
        "push": Channel(name="push", provider=a, fallback=("backup",)),
        "backup": Channel(name="backup", provider=b),
    }
    app = await open_app(channels, direct=True)
    n = await app.notify("e", "u", "push", {})
    await run(app, app.worker(settings=SETTINGS, worker_id="A"), clock, n.delivery_id, 6)
    rec = await app.get(n.delivery_id)
    delivery, attempts = rec.delivery, rec.attempts
    assert delivery.status is DeliveryStatus.SENT
    assert providers(attempts) == ["push", "backup", "push"]
    assert b.received(n.idempotency_key) == 1


async def test_a_late_refusal_that_withdraws_a_hold_fails_over(open_app, clock) -> None:
    """A's request is slow; B takes over once the lease ends and holds the delivery in
    doubt; then A's answer comes: a permanent refusal. The hold is withdrawn and the
    delivery fails over to the fallback, as the same refusal in time would have (issue
    20, defect 10: on main it became a dead letter without trying the fallback)."""
    a = FlakyProvider(idempotent=False, script=["permanent"])
    b = FlakyProvider()
    channels = {
        "push": Channel(name="push", provider=a, fallback=("backup",), on_unknown=OnUnknown.HOLD),
        "backup": Channel(name="backup", provider=b),
    }
    app = await open_app(channels, direct=True)
    n = await app.notify("e", "u", "push", {})
    cp = Checkpoints()
    late = cp.pause("after_provider_response", worker_id="A")
    wa = app.worker(settings=SETTINGS, worker_id="A", checkpoints=cp)
    wb = app.worker(settings=SETTINGS, worker_id="B")
    task = asyncio.create_task(wa.run_once())
    await late.reached()
    clock.advance(LEASE + 1)
    await wb.run_once()  # reaps A's lease; A's request may have arrived: held
    held = await app.get(n.delivery_id)
    assert (held.delivery.status, held.delivery.doubt) == (DeliveryStatus.IN_DOUBT, Doubt.HELD)
    late.release()
    await task  # A's late 400 withdraws the hold
    await run(app, wb, clock, n.delivery_id, 4)
    rec = await app.get(n.delivery_id)
    delivery, attempts = rec.delivery, rec.attempts
    assert delivery.status is DeliveryStatus.SENT
    assert providers(attempts) == ["push", "backup"]
    assert b.effective(n.idempotency_key) == 1


async def test_a_late_refusal_with_no_fallback_left_fails_without_a_request(
    open_app, clock
) -> None:
    """The same late refusal on a channel without fallback: the withdrawn hold fails the
    delivery at the next claim, with no request to the provider that refused it."""
    a = FlakyProvider(idempotent=False, script=["permanent"])
    channels = {"push": Channel(name="push", provider=a, on_unknown=OnUnknown.HOLD)}
    app = await open_app(channels, direct=True)
    n = await app.notify("e", "u", "push", {})
    cp = Checkpoints()
    late = cp.pause("after_provider_response", worker_id="A")
    wa = app.worker(settings=SETTINGS, worker_id="A", checkpoints=cp)
    wb = app.worker(settings=SETTINGS, worker_id="B")
    task = asyncio.create_task(wa.run_once())
    await late.reached()
    clock.advance(LEASE + 1)
    await wb.run_once()
    late.release()
    await task
    await run(app, wb, clock, n.delivery_id, 4)
    rec = await app.get(n.delivery_id)
    delivery, job = rec.delivery, rec.job
    assert (delivery.status, job.status) == (DeliveryStatus.FAILED, JobStatus.DEAD)
    assert "refused for good by every channel" in (delivery.last_error or "")
    assert a.received(n.idempotency_key) == 1


async def test_a_refusal_after_a_doubt_that_vanished_meanwhile_fails_over(
    open_app, clock, captured_logs
) -> None:
    """A's request is refused for good but A stalls before its commit; B takes over, and
    resends with the same key (the channel is idempotent): refused too. A's late refusal
    is recorded while B's request is out, so at B's commit no request may have arrived:
    the delivery fails over to the fallback, as a refusal without doubt does (explorer
    seed 8993: on main it failed with attempts and a fallback left)."""
    a = FlakyProvider(idempotent=True, script=["permanent", "permanent"])
    b = FlakyProvider()
    channels = {
        "push": Channel(name="push", provider=a, fallback=("backup",)),
        "backup": Channel(name="backup", provider=b),
    }
    app = await open_app(channels, direct=True)
    n = await app.notify("e", "u", "push", {})
    cp = Checkpoints()
    late_a = cp.pause("after_provider_response", worker_id="A")
    late_b = cp.pause("after_provider_response", worker_id="B")
    wa = app.worker(settings=SETTINGS, worker_id="A", checkpoints=cp)
    wb = app.worker(settings=SETTINGS, worker_id="B", checkpoints=cp)
    task_a = asyncio.create_task(wa.run_once())
    await late_a.reached()
    clock.advance(LEASE + 1)
    task_b = asyncio.create_task(wb.run_once())  # takes over: A's request is in doubt
    await late_b.reached()
    late_a.release()
    await task_a  # A's refusal, late: recorded, the doubt is gone
    late_b.release()
    await task_b
    lines = [json.loads(line) for line in captured_logs.getvalue().splitlines()]
    [b_wrote] = [x for x in lines if x["event"] == "db_update" and x["worker_id"] == "B"]
    # the log says what the commit wrote, not the worker's proposal (a hold)
    assert (b_wrote["status"], b_wrote["doubt"]) == ("pending", None), b_wrote
    await run(app, wb, clock, n.delivery_id, 4)
    record = await app.get(n.delivery_id)
    assert record.delivery.status is DeliveryStatus.SENT
    assert providers(list(record.attempts)) == ["push", "push", "backup"]
    assert b.effective(n.idempotency_key) == 1


def test_the_engine_refuses_a_fallback_of_another_kind_of_address() -> None:
    """Channels given to Kirim are held to the rule of the configuration's loader."""
    from kirim.channels import Channel
    from kirim.config import Config
    from kirim.engine import Kirim
    from kirim.errors import ConfigError
    from kirim.testing import FlakyProvider

    class Phone(FlakyProvider):
        address_kind = "phone"

    class Email(FlakyProvider):
        address_kind = "email"

    channels = {
        "sms": Channel(name="sms", provider=Phone(), fallback=("mail",)),
        "mail": Channel(name="mail", provider=Email()),
    }
    with pytest.raises(ConfigError, match="'mail' takes email addresses, 'sms' takes phone"):
        Kirim(Config(database="sqlite:///unused.db"), channels=channels)


async def test_a_refusal_after_the_provider_said_it_had_nothing_fails_over(open_app, clock) -> None:
    """The first request's answer is lost. Once it has settled the worker asks the
    provider, which has nothing, and sends again: refused for good. Nothing is in doubt
    (the provider said so): the delivery fails over at once, as a refusal without doubt
    does, and the first request is recorded as not processed (explorer seed 21462,
    pct:3: on main it was held in doubt, and an operator's reconcile then failed it with
    the fallback never tried)."""
    a = FlakyProvider(idempotent=False, script=["ambiguous", "permanent"])
    b = FlakyProvider()
    channels = {
        "push": Channel(name="push", provider=a, fallback=("backup",), lookup=True),
        "backup": Channel(name="backup", provider=b),
    }
    app = await open_app(channels, direct=True, max_attempts=3)
    n = await app.notify("e", "u", "push", {})
    worker = app.worker(settings=SETTINGS)
    await worker.run_once()  # the first request: no answer
    clock.advance(3600)  # settled; the provider is asked (nothing), the second is refused
    await worker.run_once()
    moved = await app.get(n.delivery_id)
    assert (moved.delivery.status, moved.delivery.doubt) == (DeliveryStatus.PENDING, None)
    await run(app, worker, clock, n.delivery_id, 4)
    done = await app.get(n.delivery_id)
    assert done.delivery.status is DeliveryStatus.SENT
    assert providers(list(done.attempts)) == ["push", "push", "backup"]
    assert [a.status for a in done.attempts][:2] == [
        AttemptStatus.FAILED_TRANSIENT,
        AttemptStatus.FAILED_PERMANENT,
    ]
    assert b.effective(n.idempotency_key) == 1
    assert a.effective(n.idempotency_key) == 0


async def held_after_a_refusal(open_app, clock, fallback: tuple[str, ...]):  # type: ignore[no-untyped-def]
    """A delivery held in doubt, its job dead with attempts left: its first request's
    answer was lost, the resend (same key: the provider keys requests) refused for good
    while the first may have arrived. Then the channel gets its lookup (an app
    configured since): the operator can reconcile it."""
    a = FlakyProvider(idempotent=True, script=["ambiguous", "permanent"])
    b = FlakyProvider()

    def channels(lookup: bool) -> dict[str, Channel]:
        push = Channel(name="push", provider=a, fallback=fallback, lookup=lookup)
        return {"push": push, "backup": Channel(name="backup", provider=b)}

    before = await open_app(channels(False), direct=True, max_attempts=3)
    n = await before.notify("e", "u", "push", {})
    worker = before.worker(settings=SETTINGS)
    await worker.run_once()  # the first request: no answer
    clock.advance(3600)
    await worker.run_once()  # the resend, refused while the first may have arrived
    held = await before.get(n.delivery_id)
    assert (held.delivery.status, held.delivery.doubt) == (DeliveryStatus.IN_DOUBT, Doubt.HELD)
    assert held.job is not None
    assert held.job.attempts < held.job.max_attempts
    app = await open_app(channels(True), direct=True, max_attempts=3)
    return app, a, b, n


async def test_a_reconcile_that_finds_nothing_sends_a_held_refusal_on_to_the_fallback(
    open_app, clock
) -> None:
    """The operator's reconcile finds nothing at the provider: the doubt is gone, and the
    held delivery goes on to its fallback, as the same refusal without a doubt would have
    (on main it failed, its attempts left and its fallback never tried)."""
    app, a, b, n = await held_after_a_refusal(open_app, clock, ("backup",))
    record = await app.reconcile(n.delivery_id)
    assert (record.delivery.status, record.delivery.doubt) == (DeliveryStatus.PENDING, None)
    await run(app, app.worker(settings=SETTINGS), clock, n.delivery_id, 4)
    done = await app.get(n.delivery_id)
    assert done.delivery.status is DeliveryStatus.SENT
    assert providers(list(done.attempts)) == ["push", "push", "backup"]
    assert b.effective(n.idempotency_key) == 1
    assert a.effective(n.idempotency_key) == 0


async def test_a_reconcile_that_finds_nothing_fails_a_refusal_with_no_fallback_left(
    open_app, clock
) -> None:
    """The same, on a channel with no fallback: back to the worker (attempts are left),
    whose route has nowhere left to go: it fails without another request."""
    app, a, _, n = await held_after_a_refusal(open_app, clock, ())
    record = await app.reconcile(n.delivery_id)
    assert record.delivery.status is DeliveryStatus.PENDING
    await run(app, app.worker(settings=SETTINGS), clock, n.delivery_id, 4)
    done = await app.get(n.delivery_id)
    assert done.delivery.status is DeliveryStatus.FAILED
    assert len(done.attempts) == 2
    assert a.received(n.idempotency_key) == 2
