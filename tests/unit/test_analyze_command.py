"""The ``kirim analyze`` click command, driven through click's CliRunner."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from kirim.analyze import analyze_paths
from kirim.analyze.command import analyze

SEED = Path(__file__).resolve().parents[1] / "fixtures" / "seed.log"
CLEAN = (
    "ts=2026-07-21T10:00:00.000Z event=job_claimed notification_id=n1 job_id=j1 attempt=1 "
    "worker_id=w1\n"
    "ts=2026-07-21T10:00:00.010Z event=provider_request notification_id=n1 job_id=j1 attempt=1 "
    "worker_id=w1 provider_request_id=r1\n"
    "ts=2026-07-21T10:00:00.300Z event=provider_response notification_id=n1 job_id=j1 "
    "attempt=1 worker_id=w1 provider_request_id=r1 result=success provider_message_id=m1\n"
    "ts=2026-07-21T10:00:00.310Z event=db_update notification_id=n1 job_id=j1 status=sent\n"
)


def run(*args: str, stdin: bytes | None = None) -> Result:
    return CliRunner().invoke(analyze, list(args), input=stdin)


def as_json(result: Result) -> dict[str, Any]:
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


def test_seed_json_reports_proven_duplicate_and_overlap() -> None:
    """On the seed, JSON shows 7712's proven duplicate and the 0.27 s overlap; exit status 1."""
    result = run(str(SEED), "--format", "json")
    assert result.exit_code == 1
    data = as_json(result)
    incidents = data["incidents"]
    (dup,) = [i for i in incidents if i["kind"] == "duplicate_request"]
    assert dup["notification_id"] == "7712"
    assert dup["proven"] is True
    assert dup["request_ids"] == ["req-abc", "req-def"]
    assert dup["provider_message_ids"] == ["p-1001", "p-1002"]
    (overlap,) = [i for i in incidents if i["kind"] == "overlapping_attempt"]
    assert overlap["notification_id"] == "7712"
    assert overlap["earlier_attempt"] == 1
    assert overlap["later_attempt"] == 2
    assert overlap["attempts"] == [1, 2]
    assert overlap["later_started_at"] == "2026-07-21T10:00:06.240Z"
    assert overlap["earlier_response_at"] == "2026-07-21T10:00:06.510Z"
    assert overlap["overlap_s"] == pytest.approx(0.27, abs=0.005)
    summary = data["summary"]
    assert summary["duplicates"] == 1
    assert summary["overlaps"] == 1
    assert summary["lines"] == 9


def test_json_summary_has_the_documented_keys() -> None:
    """The JSON summary carries at least the documented keys."""
    summary = as_json(run(str(SEED), "--format", "json"))["summary"]
    expected = {
        "lines", "malformed_lines", "notifications", "duplicates", "overlaps", "late_writes",
        "worst_gaps", "provider_latency_p99_s", "suggested_lease_s",
    }  # fmt: skip
    assert expected <= set(summary)


def test_text_report_shows_verdict_and_timeline() -> None:
    """The default text report names the proven duplicate and replays the pseudo-log."""
    result = run(str(SEED))
    assert result.exit_code == 1
    assert "PROVEN" in result.stdout
    assert "overlapping_attempt" in result.stdout
    assert "action=provider_request request_id=req-def" in result.stdout


def test_markdown_report() -> None:
    """--format markdown renders a summary table and incident sections."""
    result = run(str(SEED), "--format", "markdown")
    assert result.exit_code == 1
    assert result.stdout.startswith("# kirim analyze report")
    assert "| duplicates | 1 |" in result.stdout
    assert "duplicate_request" in result.stdout


def test_clean_log_exits_zero(tmp_path: Path) -> None:
    """A log without a proven duplicate exits 0."""
    log = tmp_path / "clean.log"
    log.write_text(CLEAN)
    result = run(str(log), "--format", "json")
    assert result.exit_code == 0
    assert as_json(result)["incidents"] == []


def test_gzip_input(tmp_path: Path) -> None:
    """Gzip input is detected by magic bytes, whatever the file is called."""
    log = tmp_path / "seed.txt"
    log.write_bytes(gzip.compress(SEED.read_bytes()))
    result = run(str(log), "--format", "json")
    assert result.exit_code == 1
    assert as_json(result)["summary"]["duplicates"] == 1


def test_stdin_dash() -> None:
    """``-`` reads the log from stdin, gzip included."""
    plain = run("-", "--format", "json", stdin=SEED.read_bytes())
    packed = run("-", "--format", "json", stdin=gzip.compress(SEED.read_bytes()))
    assert plain.exit_code == packed.exit_code == 1
    assert as_json(plain)["summary"]["duplicates"] == 1
    assert as_json(packed)["summary"]["duplicates"] == 1


def test_malformed_lines_counted(tmp_path: Path) -> None:
    """Broken JSON and binary junk are counted in malformed_lines and do not stop analysis."""
    log = tmp_path / "mixed.log"
    log.write_bytes(b'{"event": "provider_req\n\xff\xfe\x00\x01junk\n' + SEED.read_bytes())
    result = run(str(log), "--format", "json")
    assert result.exit_code == 1
    summary = as_json(result)["summary"]
    assert summary["malformed_lines"] == 2
    assert summary["lines"] == 11


def test_field_mapping_option(tmp_path: Path) -> None:
    """--field canonical=theirs lets foreign key names drive the analysis."""
    renamed = SEED.read_text().replace("notification_id=", "notif=").replace("request_id=", "rq=")
    log = tmp_path / "renamed.log"
    log.write_text(renamed)
    without = as_json(run(str(log), "--format", "json"))
    result = run(
        str(log), "--format", "json",
        "--field", "notification_id=notif", "--field", "provider_request_id=rq",
    )  # fmt: skip
    assert without["summary"]["duplicates"] == 0
    assert result.exit_code == 1
    (dup,) = [i for i in as_json(result)["incidents"] if i["kind"] == "duplicate_request"]
    assert dup["request_ids"] == ["req-abc", "req-def"]


def test_late_after_option(tmp_path: Path) -> None:
    """--late-after lowers the threshold for a late status write."""
    log = tmp_path / "clean.log"
    log.write_text(CLEAN)
    assert as_json(run(str(log), "--format", "json"))["summary"]["late_writes"] == 0
    result = run(str(log), "--format", "json", "--late-after", "0.005")
    data = as_json(result)
    assert data["summary"]["late_writes"] == 1
    (late,) = data["incidents"]
    assert late["gap_s"] == pytest.approx(0.01)


def test_output_file(tmp_path: Path) -> None:
    """--output writes the report to a file and nothing to stdout."""
    target = tmp_path / "report.json"
    result = run(str(SEED), "--format", "json", "--output", str(target))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert json.loads(target.read_text())["summary"]["duplicates"] == 1


def test_unreadable_file_is_a_usage_error(tmp_path: Path) -> None:
    """A missing file gives a one-line message on stderr and exit status 2."""
    result = run(str(tmp_path / "nope.log"))
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "nope.log" in result.stderr


def test_bad_field_spec_is_a_usage_error() -> None:
    """An unknown canonical field name in --field exits 2."""
    result = run(str(SEED), "--field", "bogus=x")
    assert result.exit_code == 2


def test_help_explains_what_it_finds() -> None:
    """--help names the four kinds of incident and the exit status."""
    result = run("--help")
    assert result.exit_code == 0
    for word in ("duplicate_request", "overlapping_attempt", "late_status_write", "Exit status"):
        assert word in result.stdout


def test_analyze_paths_reports_progress(tmp_path: Path) -> None:
    """analyze_paths reports progress per file, ending at the file's size."""
    log = tmp_path / "seed.log"
    log.write_bytes(SEED.read_bytes())
    calls: list[tuple[str, int, int | None]] = []
    report = analyze_paths([log], progress=lambda *call: calls.append(call))
    size = log.stat().st_size
    assert calls[-1] == (str(log), size, size)
    assert report.summary.duplicates == 1
