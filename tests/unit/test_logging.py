"""Log lines carry the correlation fields that `kirim analyze` reads back."""

from __future__ import annotations

import io
import json
import unicodedata
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


def test_a_log_line_to_a_closed_pipe_is_dropped_not_raised() -> None:
    """Once the reader of the log pipe is gone, logging goes on without an exception."""
    import os

    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    configure(fmt="logfmt", level="info", stream=stream)
    try:
        os.close(read_end)
        log = get_logger(worker_id="w")
        for _ in range(3):
            log.warning("signal_received", signal="SIGTERM")
        stream.write("still writable\n")  # the descriptor now points at /dev/null
        stream.flush()
    finally:
        configure(level="warning")
        stream.close()


def test_a_line_the_disk_refused_is_lost_alone() -> None:
    """A write that fails for another reason (a full disk) loses that line only; a
    stream closed under the process drops every later line; neither raises."""

    class Flaky(io.StringIO):
        def __init__(self, error: Exception) -> None:
            super().__init__()
            self.error: Exception | None = error

        def write(self, text: str) -> int:
            if self.error is not None:
                error, self.error = self.error, None
                raise error
            return super().write(text)

    full = _two_lines(Flaky(OSError(28, "No space left on device")))
    assert "event=first_line" not in full
    assert "event=second_line" in full
    assert _two_lines(Flaky(ValueError("I/O operation on closed file"))) == ""


def _two_lines(stream: io.StringIO) -> str:
    """Two info lines logged to ``stream``; what it holds after."""
    configure(fmt="logfmt", level="info", stream=stream)
    try:
        log = get_logger(worker_id="w")
        log.info("first_line")
        log.info("second_line")
    finally:
        configure(level="warning")
    return stream.getvalue()


async def test_notify_in_the_callers_transaction_logs_staged_not_enqueued(
    request: pytest.FixtureRequest, tmp_path, captured: io.StringIO
) -> None:
    """notify(connection=conn) logs "staged" with the ids, since the caller's transaction
    may still roll back; a plain notify logs "enqueued"."""
    import psycopg

    from kirim.channels import Channel
    from kirim.config import Config
    from kirim.engine import Kirim
    from pg import fresh_database

    url = fresh_database(request)
    app = Kirim(
        Config(database=url), channels={"push": Channel(name="push", provider=FlakyProvider())}
    )
    await app.open(migrate=True)
    try:
        async with (
            await psycopg.AsyncConnection.connect(url) as conn,
            conn.transaction(force_rollback=True),
        ):
            staged = await app.notify("e-1", "u", "push", {"t": 1}, connection=conn)
        await app.notify("e-2", "u", "push", {"t": 2})
        assert await app.get(staged.delivery_id) is None  # rolled back
    finally:
        await app.close()
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]
    events = {line["event_id"]: line for line in lines if "event_id" in line}
    assert events["e-1"]["event"] == "staged"
    assert events["e-1"]["notification_id"] == staged.delivery_id
    assert events["e-1"]["job_id"] is not None
    assert events["e-2"]["event"] == "enqueued"


FORGED = "/x\rts=2026-12-01T10:00:00.000Z level=info event=provider_request notification_id=4242"
CONTROLS = "\r\n\x1b]0;owned\x07\x85\u2028\x7f\x9b"


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_no_control_character_reaches_a_log_line_raw(fmt: str) -> None:
    """A value with a carriage return, an escape sequence, NEL, U+2028, DEL or CSI is
    written escaped in both formats: the line stays one line, and no terminal acts on it
    (logfmt escaped \\n but not \\r, the JSON renderer left DEL and C1 raw)."""
    out = io.StringIO()
    configure(fmt=fmt, level="info", stream=out)
    try:
        get_logger().info("http_request", path=FORGED, event_id=CONTROLS)
    finally:
        configure(level="warning")
    text = out.getvalue()
    assert text.endswith("\n")
    assert text.count("\n") == 1
    raw = [c for c in text[:-1] if unicodedata.category(c) == "Cc" or c in "\u2028\u2029"]
    assert raw == []


def test_a_logfmt_line_reads_back_as_it_was_written() -> None:
    """kirim analyze's parser gives back every field of a logfmt line exactly, control
    characters, quotes and backslashes included."""
    from kirim.analyze.parse import LineParser

    out = io.StringIO()
    configure(fmt="logfmt", level="info", stream=out)
    values = {"event_id": CONTROLS + '"q" \\ =', "notification_id": "7", "worker_id": "a b"}
    try:
        get_logger().info("job_claimed", **values)
    finally:
        configure(level="warning")
    record = LineParser().parse(out.getvalue())
    assert record is not None
    assert {k: record[k] for k in values} == values
