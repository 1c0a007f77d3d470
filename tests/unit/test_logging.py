"""Log lines carry the correlation fields that `kirim analyze` reads back."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest

from kirim.observe.logging import configure, get_logger
from kirim.testing import FlakyProvider
from kirim.worker import WorkerSettings

CORRELATION = {"notification_id", "event_id", "job_id", "attempt", "worker_id", "idempotency_key"}
PATH_EVENTS = {"job_claimed", "provider_request", "provider_response", "db_update"}


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    out = io.StringIO()
    configure(fmt="json", level="info", stream=out)
    yield out
    configure(level="warning")


async def test_every_delivery_path_line_is_correlated(make_app, captured) -> None:
    """Each line of the delivery path names the delivery, job, attempt, worker and key."""
    app = await make_app(FlakyProvider())
    await app.notify("48291", "1007", "push", {"t": 1})
    await app.worker(settings=WorkerSettings(lease=5), worker_id="A").run_once()
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]
    path = [line for line in lines if line["event"] in PATH_EVENTS]
    assert {line["event"] for line in path} == PATH_EVENTS
    for line in path:
        assert set(line) >= CORRELATION, line
        assert line["worker_id"] == "A"
        assert line["ts"].endswith("Z")
        if line["event"] != "job_claimed":
            assert line["provider_request_id"].startswith("req-")
    response = next(line for line in path if line["event"] == "provider_response")
    assert response["result"] == "success"
    assert response["provider_message_id"].startswith("p-")
    assert next(line for line in path if line["event"] == "db_update")["status"] == "sent"


def test_secrets_are_redacted() -> None:
    """Tokens, passwords and keys of any secret-looking field never reach the log."""
    out = io.StringIO()
    configure(fmt="logfmt", level="info", stream=out)
    try:
        get_logger().info("configured", token="t0k", api_key="k3y", db_password="pw", url="u")
    finally:
        configure(level="warning")
    text = out.getvalue()
    for secret in ("t0k", "k3y", "pw"):
        assert secret not in text
    assert "url=u" in text
    assert text.startswith("ts=")
