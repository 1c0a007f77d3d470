"""A delivery's logger binds its fields only when one of its lines is written, and
writes the lines a bound structlog logger writes (kirim.worker.delivery_log); the
library's route drops a line its logger would not write before making the event."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from kirim.observe import logging as kirim_logging
from kirim.observe.logging import configure, get_logger
from kirim.worker.delivery_log import DeliveryLog, enabled

FIELDS = {"notification_id": 7, "event_id": "e7", "job_id": 9, "attempt": 1}


class Recorder:
    """A logger that records what it was asked: binds and lines (no output)."""

    def __init__(self, level: int, context: dict[str, Any] | None = None) -> None:
        self.level = level
        self.context = context or {}
        self.binds: list[dict[str, Any]] = []
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def is_enabled_for(self, level: int) -> bool:
        return level >= self.level

    def bind(self, **fields: Any) -> Recorder:
        self.binds.append(fields)
        bound = Recorder(self.level, {**self.context, **fields})
        bound.lines = self.lines  # one record of lines for a logger and its binds
        return bound

    def _line(self, method: str, event: str, fields: dict[str, Any]) -> None:
        self.lines.append((method, event, {**self.context, **fields}))

    def info(self, event: str, **fields: Any) -> None:
        self._line("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._line("warning", event, fields)


def test_nothing_is_bound_while_no_line_is_written() -> None:
    """At warning the info lines of a delivery bind nothing and write nothing; its
    first warning binds its fields once, with those bound later."""
    base = Recorder(logging.WARNING)
    log = DeliveryLog(base, dict(FIELDS))
    later = log.bind(provider_request_id="req-1")
    log.info("job_claimed", token="abc")
    later.info("provider_request", provider="push")
    assert base.binds == []
    assert base.lines == []
    later.warning("not_sent", reason="late")
    later.warning("commit_retry", error="x")
    assert base.binds == [{**FIELDS, "provider_request_id": "req-1"}]
    assert base.lines == [
        ("warning", "not_sent", {**FIELDS, "provider_request_id": "req-1", "reason": "late"}),
        ("warning", "commit_retry", {**FIELDS, "provider_request_id": "req-1", "error": "x"}),
    ]


def test_info_lines_are_written_when_info_is_on() -> None:
    base = Recorder(logging.INFO)
    DeliveryLog(base, dict(FIELDS)).info("job_claimed", retry=False)
    assert base.lines == [("info", "job_claimed", {**FIELDS, "retry": False})]


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_a_delivery_line_is_the_line_a_bound_logger_writes(fmt: str) -> None:
    """The lines DeliveryLog writes are those of ``log.bind(**fields)``, the time
    stamp aside."""
    out = io.StringIO()
    configure(fmt=fmt, level="info", stream=out)
    try:
        base = get_logger(worker_id="w")
        base.bind(**FIELDS).bind(provider_request_id="req-1").info("db_update", status="sent")
        base.bind(**FIELDS).warning("not_sent", reason="late")
        lazy = DeliveryLog(base, dict(FIELDS))
        lazy.bind(provider_request_id="req-1").info("db_update", status="sent")
        lazy.warning("not_sent", reason="late")
    finally:
        configure(level="warning")
    lines = [_without_time(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 4
    assert lines[:2] == lines[2:]


def _without_time(line: str) -> Any:
    if line.startswith("ts="):
        return line.split(" ", 1)[1]
    fields = json.loads(line)
    del fields["ts"]
    return fields


def test_enabled_asks_each_kind_of_logger() -> None:
    at_warning = structlog.make_filtering_bound_logger(logging.WARNING)(None, [], {})
    at_info = structlog.make_filtering_bound_logger(logging.INFO)(None, [], {})
    assert not enabled(at_warning, logging.INFO)
    assert enabled(at_info, logging.INFO)
    std = logging.getLogger("kirim.test_delivery_log")
    std.setLevel(logging.WARNING)
    assert not enabled(std, logging.INFO)
    assert enabled(std, logging.ERROR)
    assert enabled(object(), logging.DEBUG)  # one that cannot say: every line written


# -- the library's route: structlog not configured, the stdlib's ``kirim`` logger ------


@pytest.fixture
def library_route() -> Iterator[list[str]]:
    """structlog as an application that never configured it has it; the ``kirim``
    logger's messages collected (kirim's own configuration restored after)."""
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Collect()
    logger = logging.getLogger(kirim_logging.STDLIB_LOGGER)
    level = logger.level
    logger.addHandler(handler)
    structlog.reset_defaults()
    try:
        yield seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        configure(level="warning")


def test_the_library_route_makes_no_event_for_a_line_it_drops(
    library_route: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the ``kirim`` logger at warning, an info line is dropped before the
    processors make its event; a warning goes through them and is written."""
    made: list[str] = []

    def count(_: Any, __: str, event: Any) -> Any:
        made.append(event["event"])
        return event

    processors = [count, *kirim_logging._STDLIB_PROCESSORS]
    monkeypatch.setattr(kirim_logging, "_STDLIB_PROCESSORS", processors)
    logging.getLogger(kirim_logging.STDLIB_LOGGER).setLevel(logging.WARNING)
    log = get_logger(worker_id="w")
    log.info("job_claimed", job_id=1)
    log.debug("detail")
    log.warning("not_sent", reason="late")
    assert made == ["not_sent"]
    assert library_route == ["event=not_sent worker_id=w reason=late"]


def test_the_library_route_writes_info_lines_when_asked(library_route: list[str]) -> None:
    logging.getLogger(kirim_logging.STDLIB_LOGGER).setLevel(logging.INFO)
    get_logger(worker_id="w").info("job_claimed", job_id=1)
    assert library_route == ["event=job_claimed worker_id=w job_id=1"]
