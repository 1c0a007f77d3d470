"""One escaping of control characters for every text sink, and a property test that no
input reaches one raw: logfmt and JSON log lines, the CLI's tables and JSON, timelines,
``kirim analyze``'s reports and the dashboard's pages."""

from __future__ import annotations

import io
import json
import unicodedata
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from kirim.analyze import analyze_lines
from kirim.analyze.report import write_report
from kirim.cli import render, tables
from kirim.limits import cut
from kirim.model import Attempt, AttemptStatus, Delivery, DeliveryStatus, Job, JobStatus, Record
from kirim.observe.logging import configure, get_logger
from kirim.text import escape_char, json_text, stored_text, visible
from kirim.timeline import events

#: the characters that end a line, move a cursor, set a title or reorder what is shown
FORGERS = [
    "\r", "\n", "\x1b", "\x07", "\x08", "\x7f", "\x85", "\x9b", "\u2028", "\u2029",
    "\u202e", "\u2066", "\x00", "\ud800",
]  # fmt: skip
hostile = st.text(
    st.one_of(st.sampled_from(FORGERS), st.characters(codec="utf-8")), min_size=1, max_size=24
)


def raw(text: str, *, lines: bool = False) -> list[str]:
    """The characters of ``text`` a sink must never show raw (``lines``: newlines are
    the sink's own, between lines)."""
    allowed = "\n" if lines else ""
    return [
        c
        for c in text
        if c not in allowed
        and (
            unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp")
            or "\u202a" <= c <= "\u202e"
            or "\u2066" <= c <= "\u2069"
        )
    ]


def record(value: str) -> Record:
    """A delivery whose every text is ``value`` (as a provider's answer or an old row
    may have left it)."""
    d = Delivery(
        id=7, idempotency_key=value, event_id=value, recipient=value, channel=value,
        payload={"v": value}, payload_hash="h", status=DeliveryStatus.FAILED,
        claim_token=None, claimed_by=value, claim_expires_at=None, provider_message_id=value,
        doubt=None, last_error=value, created_at=1.8e9, updated_at=1.8e9, sent_at=None,
        type=value, recipient_id=value, reason=value,
    )  # fmt: skip
    job = Job(
        id=3, delivery_id=7, status=JobStatus.DEAD, run_at=1.8e9, attempts=1, max_attempts=1,
        lease_owner=value, lease_token=None, lease_expires_at=1.8e9 + 5, last_error=value + "!",
        created_at=1.8e9, updated_at=1.8e9,
    )  # fmt: skip
    attempt = Attempt(
        id=1, delivery_id=7, job_id=3, number=1, provider_request_id=value, worker_id=value,
        status=AttemptStatus.FAILED_PERMANENT, provider_message_id=value, error=value,
        requested_at=1.8e9, completed_at=1.8e9 + 1, provider=value,
    )  # fmt: skip
    return Record(d, job, [attempt])


def test_escape_char_writes_what_python_writes() -> None:
    """\\r, \\x1b, \\u2028: the forms of a string literal, reversible by the analyzer."""
    assert [escape_char(c) for c in "\r\n\t\x1b\x85\u2028"] == [
        "\\r", "\\n", "\\t", "\\x1b", "\\x85", "\\u2028",
    ]  # fmt: skip
    assert visible("ok é 漢 😀") == "ok é 漢 😀"
    assert json.loads(json_text({"a": "\x85\u2028\ud800"}).replace("\\ud800", "?")) == {
        "a": "\x85\u2028?"
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=hostile)
def test_no_input_reaches_a_sink_raw(value: str) -> None:
    """Whatever a field holds, no sink writes a control character of it raw: log lines
    (one line each, both formats), the CLI's status and list tables and its JSON, the
    timeline's lines and kirim analyze's text and markdown reports (of a log another
    writer left raw, too)."""
    for fmt in ("logfmt", "json"):
        out = io.StringIO()
        configure(fmt=fmt, level="info", stream=out)
        try:
            get_logger().info("provider_response", notification_id=value, error=value)
        finally:
            configure(level="warning")
        assert out.getvalue().count("\n") == 1
        assert raw(out.getvalue(), lines=True) == [], fmt
    rec = record(value)
    for width in (60, 80, 120):
        console = Console(file=io.StringIO(), width=width, color_system=None, highlight=False)
        tables.show_status(console, rec)
        tables.show_deliveries(console, [rec], title="deliveries")
        shown = console.file.getvalue()  # type: ignore[attr-defined]
        assert raw(shown, lines=True) == [], width
    from kirim.views import delivery_json

    text = json_text(delivery_json(rec))
    assert raw(text) == []
    for e in events(rec, now=1.8e9 + 10):
        assert raw(e.line) == []
    # a line of another writer's log, with the value raw (less line ends)
    line = "ts=2026-12-01T10:00:00Z event=provider_request notification_id=n1 x="
    line += value.replace("\n", "")
    logged = io.StringIO()
    configure(fmt="logfmt", level="info", stream=logged)
    try:
        log = get_logger()
        log.info("provider_request", notification_id="n1", provider_request_id="r1", v=value)
        log.info("provider_request", notification_id="n1", provider_request_id="r2", v=value)
    finally:
        configure(level="warning")
    report = analyze_lines([*logged.getvalue().splitlines(keepends=True), line + "\n"])
    for fmt in ("text", "markdown"):
        sink = io.StringIO()
        write_report(report, fmt, sink, color=False)
        assert raw(sink.getvalue(), lines=True) == [], fmt


def emitted(capsys: Any, value: str) -> str:
    render.emit_json({"v": value})
    return str(capsys.readouterr().out)


def test_the_clis_json_shows_no_control_character_raw(capsys: Any) -> None:
    """--json output escapes C1 controls, separators and bidirectional overrides too
    (json.dumps with ensure_ascii=False wrote them raw; a lone surrogate crashed)."""
    out = emitted(capsys, "a\x9b31m\u2028\u202eb\ud800")
    assert raw(out, lines=True) == []
    assert json.loads(out.replace("\\ud800", "")) == {"v": "a\x9b31m\u2028\u202eb"}


def _stored_the_long_way(value: str, limit: int) -> str:
    """``stored_text`` with no shortcut: NULs replaced, lone surrogates replaced, cut."""
    clean = value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    return cut(clean, limit)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=40), st.integers(min_value=1, max_value=30))
def test_stored_text_is_the_long_way_whatever_the_text(value: str, limit: int) -> None:
    """The ASCII shortcut (nothing to replace nor to cut) stores what the long way does."""
    assert stored_text(value, limit=limit) == _stored_the_long_way(value, limit)
    ascii_value = value.encode("ascii", "replace").decode() + "\x00"
    assert stored_text(ascii_value, limit=limit) == _stored_the_long_way(ascii_value, limit)
