"""Log forgery: what a client sends (a path, an event id) cannot make a log line that
``kirim analyze`` reads as kirim's own event."""

from __future__ import annotations

import io
from pathlib import Path

from http_kit import api_on
from kirim.analyze import analyze_lines, iter_lines
from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.observe.logging import configure
from kirim.testing import FlakyProvider

#: a forged request line, twice, with two different message ids: a proven duplicate
FORGED = [
    "/x%0Dts=2026-12-01T10:00:0{n}.000Z%20level=info%20event=provider_request"
    "%20notification_id=4242%20provider_request_id=req-{n}%20attempt={n}%20worker_id=w{n}",
    "/x%0Dts=2026-12-01T10:00:0{n}.500Z%20level=info%20event=provider_response"
    "%20notification_id=4242%20provider_request_id=req-{n}%20result=success"
    "%20provider_message_id=m-{n}",
]


async def test_a_carriage_return_in_a_path_forges_no_request(tmp_path: Path) -> None:
    """Unauthenticated requests to paths holding %0D and a fake provider_request: the
    access log keeps each on one line, escaped, and analyze finds no notification
    (it reported a PROVEN duplicate of notification 4242, which does not exist)."""
    kirim = Kirim(
        Config(database=f"sqlite:///{tmp_path / 'k.db'}"),
        channels={"push": Channel(name="push", provider=FlakyProvider())},
    )
    await kirim.open(migrate=True)
    out = io.StringIO()
    configure(fmt="logfmt", level="info", stream=out)
    try:
        async with api_on(kirim) as api:
            for n in (1, 2):
                for path in FORGED:
                    answer = await api.client.get(path.format(n=n), headers={"Authorization": ""})
                    assert answer.status_code in (401, 404)
    finally:
        configure(level="warning")
        await kirim.close()
    log = out.getvalue().encode()
    lines = list(iter_lines(io.BytesIO(log)))
    assert len(lines) == log.count(b"\n") >= 4
    report = analyze_lines(lines)
    assert report.summary.notifications == 0
    assert report.incidents == ()
    assert report.exit_code == 0


def test_the_analyzer_splits_lines_on_newlines_only() -> None:
    """A raw carriage return (or NEL, U+2028) inside a line does not start a new line
    for the analyzer: the writer ends lines with \\n alone."""
    raw = b"ts=2026-12-01T10:00:00Z event=http_request path=/x\r event=provider_request\n"
    raw += "ts=2026-12-01T10:00:01Z event=http_request path=/y\u2028z\n".encode()
    assert len(list(iter_lines(io.BytesIO(raw)))) == 2


def test_the_first_of_two_same_fields_wins() -> None:
    """A line that names its event twice is the event it named first (kirim writes ts,
    level and event first: what a client put later in the line cannot replace them)."""
    from kirim.analyze.parse import LineParser

    line = "ts=2026-12-01T10:00:00Z level=info event=http_request path=/x event=provider_request"
    record = LineParser().parse(line)
    assert record is not None
    assert record["event"] == "http_request"
    quoted = line + ' notification_id=4242 note="a b"'
    record = LineParser().parse(quoted)
    assert record is not None
    assert record["event"] == "http_request"


async def test_an_id_with_a_control_character_is_refused(tmp_path: Path) -> None:
    """notify() refuses an event id, recipient or key holding a carriage return or an
    escape sequence (it reached every worker log line and terminal raw)."""
    import pytest

    from kirim.errors import InvalidNotification

    kirim = Kirim(
        Config(database=f"sqlite:///{tmp_path / 'k.db'}"),
        channels={"push": Channel(name="push", provider=FlakyProvider())},
    )
    await kirim.open(migrate=True)
    try:
        for field in ("event_id", "recipient"):
            fields = {"event_id": "e", "recipient": "r", "channel": "push", "payload": {}}
            with pytest.raises(InvalidNotification, match=f"{field} must not contain control"):
                await kirim.notify(**{**fields, field: "a\rts=x event=provider_request"})
        with pytest.raises(InvalidNotification, match="printable ASCII"):
            await kirim.notify("e", "r", "push", {}, key="k\x1b[2J")
    finally:
        await kirim.close()
