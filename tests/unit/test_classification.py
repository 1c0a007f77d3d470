"""Per-channel classes of HTTP statuses (retry_on, ambiguous_on, permanent_on) against a
real HTTP server on 127.0.0.1, the defaults they leave alone, and Retry-After."""

from __future__ import annotations

import email.utils
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kirim.channels import Channel
from kirim.config import Config, parse_config
from kirim.engine import Kirim
from kirim.errors import AmbiguousFailure, ConfigError, PermanentFailure, TransientFailure
from kirim.model import AttemptStatus, DeliveryStatus, Doubt, JobStatus
from kirim.providers.base import Message
from kirim.providers.webhook import WebhookProvider, default_class, status_classes
from kirim.testing import ManualClock
from kirim.worker import WorkerSettings


@pytest.fixture
def answers() -> Iterator[tuple[str, list[tuple[int, dict[str, str]]]]]:
    """A server answering each POST with the next (status, headers) of the list."""
    script: list[tuple[int, dict[str, str]]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            code, headers = script.pop(0)
            self.send_response(code)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"nope")

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", script
    server.shutdown()
    server.server_close()


def message() -> Message:
    return Message(
        delivery_id=1,
        idempotency_key="k-1",
        provider_request_id="req-1",
        event_id="e-1",
        recipient="u-1",
        channel="push",
        payload={},
        attempt=1,
    )


async def classify(url: str, **options: Any) -> Exception:
    provider = WebhookProvider(url, **options)
    try:
        with pytest.raises((PermanentFailure, TransientFailure, AmbiguousFailure)) as caught:
            await provider.send(message())
    finally:
        await provider.aclose()
    return caught.value


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (301, AmbiguousFailure),  # a redirect is not followed: kirim cannot know
        (400, PermanentFailure),
        (401, PermanentFailure),
        (404, PermanentFailure),
        (408, TransientFailure),
        (409, AmbiguousFailure),  # an earlier request with the key is in progress
        (422, PermanentFailure),
        (429, TransientFailure),
        (500, AmbiguousFailure),
        (502, AmbiguousFailure),
        (503, AmbiguousFailure),
        (504, AmbiguousFailure),
    ],
)
async def test_the_defaults_are_unchanged(answers, code, error) -> None:
    """Without overrides: 408/429 retried, 409 and 5xx ambiguous, other 4xx permanent."""
    url, script = answers
    script.append((code, {}))
    failure = await classify(url)
    assert type(failure) is error
    assert default_class(code) is error


@pytest.mark.parametrize(
    ("options", "code", "error"),
    [
        ({"retry_on": [503]}, 503, TransientFailure),
        ({"retry_on": [500, 503]}, 500, TransientFailure),
        ({"ambiguous_on": [400]}, 400, AmbiguousFailure),
        ({"permanent_on": [500]}, 500, PermanentFailure),
        ({"permanent_on": [409]}, 409, PermanentFailure),
        ({"retry_on": [404]}, 404, TransientFailure),
        ({"retry_on": [503]}, 502, AmbiguousFailure),  # only the codes named change
        ({"ambiguous_on": [502]}, 404, PermanentFailure),
    ],
)
async def test_a_channel_overrides_the_class_of_a_status(answers, options, code, error) -> None:
    """retry_on, ambiguous_on and permanent_on move exactly the codes they list."""
    url, script = answers
    script.append((code, {}))
    failure = await classify(url, **options)
    assert type(failure) is error
    assert failure.status_code == code  # type: ignore[attr-defined]


@pytest.mark.parametrize("code", [408, 429, 500, 503])
async def test_retry_after_is_honoured_for_every_retried_status(answers, code) -> None:
    """Whatever status is retried, its Retry-After (seconds or an HTTP date) is kept."""
    url, script = answers
    later = email.utils.formatdate(time.time() + 90, usegmt=True)
    script += [(code, {"Retry-After": "42"}), (code, {"Retry-After": later})]
    options = {} if code in (408, 429) else {"retry_on": [code]}
    first = await classify(url, **options)
    second = await classify(url, **options)
    assert isinstance(first, TransientFailure)
    assert isinstance(second, TransientFailure)
    assert first.retry_after == 42.0
    assert second.retry_after is not None
    assert 80 < second.retry_after <= 90


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"retry_on": [503], "ambiguous_on": [503]}, "in another of"),
        ({"retry_on": [200]}, "from 300 to 599"),
        ({"permanent_on": [600]}, "from 300 to 599"),
        ({"retry_on": ["503"]}, "from 300 to 599"),
        ({"retry_on": [True]}, "from 300 to 599"),
        ({"retry_on": 503}, "must be a list"),
    ],
)
def test_config_refuses_bad_classes(options, problem) -> None:
    """A code outside 300-599, a code in two lists, a list that is not one: ConfigError."""
    with pytest.raises(ConfigError, match=problem):
        parse_config({"channels": {"push": {"url": "http://127.0.0.1:9/x", **options}}})
    if not isinstance(options.get("retry_on"), int):
        with pytest.raises(ValueError, match=problem):
            status_classes(**options)


# -- through the worker ---------------------------------------------------------------


async def deliver_one(tmp_path: Path, provider: WebhookProvider) -> tuple[Any, Any, Any, float]:
    clock = ManualClock()
    app = Kirim(
        Config(database=f"sqlite:///{tmp_path / 'kirim.db'}"),
        channels={"push": Channel(name="push", provider=provider)},
        clock=clock,
    )
    await app.open(migrate=True)
    try:
        n = await app.notify("order-1", "user-1", "push", {"t": 1})
        await app.worker(settings=WorkerSettings(lease=10), worker_id="A").run_once()
        record = await app.get(n.delivery_id)
        delivery, job, attempts = record.delivery, record.job, record.attempts
    finally:
        await app.close()
    return delivery, job, attempts, clock.now()


async def test_a_503_retried_by_the_channel_waits_for_its_retry_after(answers, tmp_path) -> None:
    """With retry_on = [503] a 503 that was never processed is retried after its
    Retry-After, instead of ending "sent, assumed" as the safe default does."""
    url, script = answers
    script.append((503, {"Retry-After": "120"}))
    delivery, job, attempts, now = await deliver_one(tmp_path, WebhookProvider(url, retry_on=[503]))
    assert delivery.status is DeliveryStatus.PENDING
    assert job.status is JobStatus.RETRY_SCHEDULED
    assert job.run_at >= now + 120
    assert [a.status for a in attempts] == [AttemptStatus.FAILED_TRANSIENT]


async def test_a_503_by_default_is_in_doubt(answers, tmp_path) -> None:
    """The default: a 503 may have been processed, so at most once: sent, assumed."""
    url, script = answers
    script.append((503, {"Retry-After": "120"}))
    delivery, _, attempts, _ = await deliver_one(tmp_path, WebhookProvider(url))
    assert (delivery.status, delivery.doubt) == (DeliveryStatus.SENT, Doubt.ASSUMED_SENT)
    assert [a.status for a in attempts] == [AttemptStatus.UNKNOWN]


def test_the_readme_channel_examples_build() -> None:
    """Each TOML example of the channels page (docs/channels.md) parses and builds."""
    import tomllib

    section = (Path(__file__).resolve().parents[2] / "docs" / "channels.md").read_text()
    examples = [part.split("```", 1)[0] for part in section.split("```toml\n")[1:]]
    assert len(examples) >= 3  # one per provider, then failover and callbacks
    kinds = set()
    for example in examples:
        config = parse_config(tomllib.loads(example))
        for spec in config.channels.values():
            kinds.add(spec.provider)
            spec.build()
    assert kinds == {"webhook", "smtp", "apprise", "twilio", "slack"}
