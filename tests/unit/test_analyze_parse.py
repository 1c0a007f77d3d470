"""Line parsing for ``kirim analyze``: logfmt, JSON, field mapping, timestamps, gzip."""

from __future__ import annotations

import gzip
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kirim.analyze import iter_lines, open_binary
from kirim.analyze.parse import LineParser, parse_field_map, parse_ts

SEED = Path(__file__).resolve().parents[1] / "fixtures" / "seed.log"


@pytest.fixture
def parser() -> LineParser:
    return LineParser()


def test_seed_start_line_maps_vocabulary(parser: LineParser) -> None:
    """The seed's ``worker=`` and ``status=start`` become worker_id and a job_claimed event."""
    rec = parser.parse(SEED.read_text().splitlines()[0])
    assert rec == {
        "ts": "2026-07-21T10:00:01.120Z",
        "worker_id": "A",
        "job_id": "9381",
        "attempt": "1",
        "event": "job_claimed",
        "notification_id": "7712",
    }


def test_seed_request_and_response_lines_map_ids(parser: LineParser) -> None:
    """``action=``, ``request_id=`` and ``provider_msg_id=`` map to kirim's canonical names."""
    lines = SEED.read_text().splitlines()
    request = parser.parse(lines[1])
    response = parser.parse(lines[5])
    assert request is not None
    assert response is not None
    assert request["event"] == "provider_request"
    assert request["provider_request_id"] == "req-abc"
    assert response["event"] == "provider_response"
    assert response["result"] == "success"
    assert response["provider_message_id"] == "p-1001"


def test_bare_db_update_word_is_a_status_write(parser: LineParser) -> None:
    """A bare ``db_update`` word names the event and ``status=sent`` stays the written status."""
    rec = parser.parse(
        "2026-07-21T10:00:06.530Z worker=A job_id=9381 attempt=1 db_update status=sent"
    )
    assert rec is not None
    assert rec["event"] == "db_update"
    assert rec["status"] == "sent"


def test_queue_lease_expired_line(parser: LineParser) -> None:
    """``status=lease_expired`` on a queue line becomes the lease_expired event, without worker."""
    rec = parser.parse("2026-07-21T10:00:06.200Z queue job_id=9381 attempt=1 status=lease_expired")
    assert rec == {
        "ts": "2026-07-21T10:00:06.200Z",
        "job_id": "9381",
        "attempt": "1",
        "event": "lease_expired",
    }


def test_quoted_logfmt_values_are_unescaped(parser: LineParser) -> None:
    """Quoted values may hold spaces and escaped quotes."""
    line = 'ts=2026-07-21T10:00:01Z result="failed transient" worker_id="w \\"1\\""'
    rec = parser.parse(line)
    assert rec is not None
    assert rec["result"] == "failed transient"
    assert rec["worker_id"] == 'w "1"'


def test_json_line_with_numbers(parser: LineParser) -> None:
    """A JSON object per line is accepted and numbers become strings."""
    line = json.dumps(
        {"ts": 1784628001.12, "event": "provider_request", "notification_id": "n1", "attempt": 2}
    )
    rec = parser.parse(line)
    assert rec == {
        "ts": "1784628001.12",
        "event": "provider_request",
        "notification_id": "n1",
        "attempt": "2",
    }


@pytest.mark.parametrize(
    "line",
    [
        '{"event": "provider_request", "notification_id": ',  # truncated JSON
        "[1, 2, 3]",  # JSON but not an object
        "\udcff\udcfe binary junk",  # undecodable bytes read with surrogateescape
        "event=db_update\x00status=sent",  # NUL byte
        "just some words without pairs",
    ],
)
def test_malformed_lines_return_none(parser: LineParser, line: str) -> None:
    """Unparseable lines are reported as malformed (None), never raising."""
    assert parser.parse(line) is None


def test_short_bare_numbers_are_not_timestamps(parser: LineParser) -> None:
    """Only a long bare token (ISO or epoch) is taken as the line's timestamp."""
    rec = parser.parse("queue 3 retries job_id=9381 status=lease_expired")
    assert rec is not None
    assert "ts" not in rec


def test_unknown_keys_are_ignored(parser: LineParser) -> None:
    """A logfmt line with only unknown keys parses to an empty record, not a malformed one."""
    assert parser.parse("component=http path=/healthz code=200") == {}


def test_field_map_maps_user_keys() -> None:
    """``--field notification_id=notif`` makes ``notif`` the notification id."""
    parser = LineParser(parse_field_map(["notification_id=notif", "worker_id=host"]))
    rec = parser.parse("notif=42 host=h1 event=job_claimed attempt=1")
    assert rec == {
        "notification_id": "42",
        "worker_id": "h1",
        "event": "job_claimed",
        "attempt": "1",
    }


@pytest.mark.parametrize("spec", ["nonsense=x", "notification_id", "=notif", "job_id="])
def test_field_map_rejects_bad_specs(spec: str) -> None:
    """Unknown canonical names and specs without CANONICAL=THEIRS are rejected."""
    with pytest.raises(ValueError, match=r"\S"):
        parse_field_map([spec])


def test_parse_ts_fast_path_matches_fromisoformat() -> None:
    """The cached fast path agrees with datetime.fromisoformat."""
    stamp = "2026-07-21T10:00:06.240Z"
    expected = datetime(2026, 7, 21, 10, 0, 6, 240000, tzinfo=UTC).timestamp()
    assert parse_ts(stamp) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        ("2026-07-21T17:00:06.240+07:00", "2026-07-21T10:00:06.240+00:00"),
        ("2026-07-21T10:00:06", "2026-07-21T10:00:06+00:00"),
        ("1784628006.24", "2026-07-21T10:00:06.240000+00:00"),
        ("1784628006240", "2026-07-21T10:00:06.240000+00:00"),
    ],
)
def test_parse_ts_offsets_and_epochs(stamp: str, expected: str) -> None:
    """Offsets, naive (UTC) times, epoch seconds and epoch milliseconds are understood."""
    value = parse_ts(stamp)
    assert value is not None
    assert value == pytest.approx(datetime.fromisoformat(expected).timestamp(), abs=1e-3)


@pytest.mark.parametrize("stamp", ["yesterday", "2026-13-45T99:00:00.000Z", ""])
def test_parse_ts_garbage_is_none(stamp: str) -> None:
    """Unparseable timestamps give None instead of raising."""
    assert parse_ts(stamp) is None


def test_gzip_detected_by_magic_bytes_without_peek() -> None:
    """Gzip data is decompressed even from a stream without ``peek`` (like a BytesIO)."""
    data = gzip.compress(b"event=db_update status=sent\nsecond=line\n")
    lines = list(iter_lines(io.BytesIO(data)))
    assert lines == ["event=db_update status=sent\n", "second=line\n"]


def test_plain_stream_passes_through() -> None:
    """Non-gzip data is read unchanged, including its first two bytes."""
    assert open_binary(io.BytesIO(b"ab=1\n")).read() == b"ab=1\n"
