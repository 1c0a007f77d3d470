"""The streaming detector behind ``kirim analyze``: incidents, summary and bounded state."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kirim.analyze import AnalyzeOptions, Detector, Incident, Report, analyze_lines

SEED = Path(__file__).resolve().parents[1] / "fixtures" / "seed.log"
BASE = 1_784_628_000.0  # 2026-07-21T10:00:00Z


def ts(offset: float) -> str:
    """kirim's timestamp format for BASE + offset seconds."""
    whole = int(offset)
    return f"2026-07-21T10:{whole // 60:02d}:{whole % 60:02d}.{round(offset % 1 * 1000):03d}Z"


def kline(at: float, event: str, nid: str, **fields: str | int | float) -> str:
    """One kirim logfmt line."""
    rest = " ".join(f"{key}={value}" for key, value in fields.items())
    return f"ts={ts(at)} level=info event={event} notification_id={nid} {rest}".rstrip()


def chain(
    nid: str,
    at: float,
    *,
    attempt: int = 1,
    worker: str = "w1",
    msg: str | None = "m",
    write: float,
) -> list[str]:
    """A claim, request, successful response and (after ``write`` s) the status write."""
    rid = f"{nid}-r{attempt}"
    common: dict[str, str | int | float] = {"job_id": f"j-{nid}", "attempt": attempt}
    common["worker_id"] = worker
    lines = [
        kline(at, "job_claimed", nid, **common),
        kline(at + 0.001, "provider_request", nid, **common, provider_request_id=rid),
        kline(
            at + 0.2,
            "provider_response",
            nid,
            **common,
            provider_request_id=rid,
            result="success",
            latency_s=0.199,
            **({"provider_message_id": f"{msg}-{attempt}"} if msg else {}),
        ),
    ]
    if write >= 0:
        lines.append(kline(at + 0.2 + write, "db_update", nid, **common, status="sent"))
    return lines


def of_kind(report: Report, kind: str) -> list[Incident]:
    return [i for i in report.incidents if i.kind == kind]


def test_seed_pseudo_log_duplicate_and_overlap() -> None:
    """The seed's 9 lines give a proven duplicate (req-abc, req-def) and a 0.27 s overlap."""
    report = analyze_lines(SEED.read_text().splitlines(keepends=True))
    (dup,) = of_kind(report, "duplicate_request")
    assert dup.notification_id == "7712"
    assert dup.proven is True
    assert dup.request_ids == ("req-abc", "req-def")
    assert dup.provider_message_ids == ("p-1001", "p-1002")
    (overlap,) = of_kind(report, "overlapping_attempt")
    assert overlap.attempts == ("1", "2")
    assert overlap.evidence["later_started_at"] == "2026-07-21T10:00:06.240Z"
    assert overlap.evidence["earlier_response_at"] == "2026-07-21T10:00:06.510Z"
    assert overlap.evidence["overlap_s"] == pytest.approx(0.27, abs=1e-3)
    assert report.summary.duplicates == 1
    assert report.summary.late_writes == 0
    assert report.exit_code == 1


def test_seed_latency_and_suggested_lease() -> None:
    """p99 comes from request→response times; the lease suggestion is max(3×p99, p99+5)."""
    report = analyze_lines(SEED.read_text().splitlines())
    assert report.summary.provider_latency_p99_s == pytest.approx(5.385)
    assert report.summary.suggested_lease_s == 17


def test_seed_job_only_line_joins_its_notification() -> None:
    """The queue's lease_expired line (job_id only) lands in notification 7712's timeline."""
    report = analyze_lines(SEED.read_text().splitlines())
    (dup,) = of_kind(report, "duplicate_request")
    assert any("status=lease_expired" in line for line in dup.timeline)
    assert report.summary.missing_correlation == 0


def test_seed_without_timestamps_uses_line_order() -> None:
    """Without timestamps the same incidents are found, with no seconds to report."""
    lines = [line.split(" ", 1)[1] for line in SEED.read_text().splitlines()]
    report = analyze_lines(lines)
    (overlap,) = of_kind(report, "overlapping_attempt")
    assert overlap.evidence["overlap_s"] is None
    assert report.summary.duplicates == 1
    assert report.summary.provider_latency_p99_s is None
    assert report.summary.suggested_lease_s is None


def test_kirim_json_lines() -> None:
    """kirim's JSON log lines are analyzed like logfmt ones."""
    records = [
        {"ts": ts(0), "event": "job_claimed", "notification_id": "n1", "attempt": 1,
         "worker_id": "a", "job_id": "j1"},
        {"ts": ts(0.01), "event": "provider_request", "notification_id": "n1", "attempt": 1,
         "worker_id": "a", "provider_request_id": "r1", "idempotency_key": "k"},
        {"ts": ts(5), "event": "job_claimed", "notification_id": "n1", "attempt": 2,
         "worker_id": "b", "job_id": "j1"},
        {"ts": ts(5.01), "event": "provider_request", "notification_id": "n1", "attempt": 2,
         "worker_id": "b", "provider_request_id": "r2", "idempotency_key": "k"},
        {"ts": ts(6), "event": "provider_response", "notification_id": "n1", "attempt": 1,
         "provider_request_id": "r1", "result": "success", "provider_message_id": "pm1",
         "latency_s": 5.99},
        {"ts": ts(6.5), "event": "provider_response", "notification_id": "n1", "attempt": 2,
         "provider_request_id": "r2", "result": "success", "provider_message_id": "pm2",
         "latency_s": 1.49},
        {"ts": ts(7.2), "event": "db_update", "notification_id": "n1", "status": "sent"},
    ]  # fmt: skip
    report = analyze_lines(json.dumps(r) for r in records)
    (dup,) = of_kind(report, "duplicate_request")
    assert dup.proven is True
    assert dup.request_ids == ("r1", "r2")
    assert dup.evidence["same_idempotency_key"] is True
    (overlap,) = of_kind(report, "overlapping_attempt")
    assert overlap.evidence["overlap_s"] == pytest.approx(1.0)
    (late,) = of_kind(report, "late_status_write")
    assert late.request_ids == ("r1",)
    assert late.evidence["gap_s"] == pytest.approx(1.2)


def test_same_message_id_is_provider_dedup_not_proven() -> None:
    """Two successes with the same provider message id are reported but not proven."""
    lines = chain("n1", 0, attempt=1, worker="a", msg="same", write=-1)
    lines += chain("n1", 0.5, attempt=2, worker="b", msg="same", write=0.01)
    lines = [
        line.replace("provider_message_id=same-1", "provider_message_id=same-2") for line in lines
    ]
    report = analyze_lines(lines)
    (dup,) = of_kind(report, "duplicate_request")
    assert dup.proven is False
    assert dup.evidence["deduplicated_by_provider"] is True
    assert dup.provider_message_ids == ("same-2",)
    assert report.summary.duplicates == 0
    assert report.summary.duplicate_risks == 1
    assert report.exit_code == 0


def test_failed_first_request_is_a_risk_not_proven() -> None:
    """A retry after a failed request is a duplicate risk, not a proven duplicate."""
    lines = [
        kline(0, "provider_request", "n1", attempt=1, provider_request_id="r1"),
        kline(1, "provider_response", "n1", attempt=1, provider_request_id="r1",
              result="failed_transient"),
        kline(1.1, "db_update", "n1", status="pending"),
        kline(3, "provider_request", "n1", attempt=2, provider_request_id="r2"),
        kline(3.5, "provider_response", "n1", attempt=2, provider_request_id="r2",
              result="success", provider_message_id="pm2"),
        kline(3.6, "db_update", "n1", status="sent"),
    ]  # fmt: skip
    report = analyze_lines(lines)
    (dup,) = of_kind(report, "duplicate_request")
    assert dup.proven is False
    assert report.summary.duplicates == 0
    assert report.summary.overlaps == 0


def test_late_status_write_reports_gap() -> None:
    """A status write more than late_after seconds after the success is a late write."""
    report = analyze_lines(chain("n1", 0, write=2.5) + chain("n2", 0, write=0.3))
    (late,) = of_kind(report, "late_status_write")
    assert late.notification_id == "n1"
    assert late.evidence["gap_s"] == pytest.approx(2.5)
    assert late.evidence["never"] is False
    assert report.summary.late_writes == 1
    assert report.summary.worst_gaps[0].gap_s == pytest.approx(2.5)


def test_late_after_threshold_is_configurable() -> None:
    """With late_after_s=0.1 a 0.3 s gap counts as late."""
    report = analyze_lines(chain("n1", 0, write=0.3), options=AnalyzeOptions(late_after_s=0.1))
    assert report.summary.late_writes == 1


def test_never_written_status() -> None:
    """A provider success with no status write at all is reported with never=true, gap null."""
    report = analyze_lines(chain("n1", 0, write=-1))
    (late,) = of_kind(report, "late_status_write")
    assert late.evidence["never"] is True
    assert late.evidence["gap_s"] is None
    assert report.summary.worst_gaps == ()


def test_overlap_with_never_answered_request_runs_to_end_of_log() -> None:
    """An earlier request that never got a response overlaps the retry until the log ends."""
    lines = [
        kline(0, "provider_request", "n1", attempt=1, worker_id="a", provider_request_id="r1"),
        kline(5, "job_claimed", "n1", attempt=2, worker_id="b"),
        kline(9, "enqueued", "n2"),
    ]
    (overlap,) = of_kind(analyze_lines(lines), "overlapping_attempt")
    assert overlap.evidence["never_answered"] is True
    assert overlap.evidence["overlap_s"] == pytest.approx(4.0)


def test_missing_request_id_and_orphan_job_lines_are_aggregated() -> None:
    """Missing correlation is one incident per notification (or null) with a count."""
    lines = [
        kline(0, "provider_request", "n1", attempt=1),
        kline(1, "provider_response", "n1", attempt=1, result="success"),
        kline(1.1, "db_update", "n1", status="sent"),
        f"ts={ts(2)} event=provider_request job_id=unknown-1 provider_request_id=x1",
        f"ts={ts(3)} event=provider_request job_id=unknown-2 provider_request_id=x2",
    ]
    report = analyze_lines(lines)
    missing = {i.notification_id: i for i in of_kind(report, "missing_correlation")}
    assert missing["n1"].evidence["fields"] == ["provider_request_id"]
    assert missing["n1"].evidence["count"] == 1
    assert missing[None].evidence["count"] == 2
    assert report.summary.missing_correlation == 3


def test_malformed_lines_are_counted_and_skipped() -> None:
    """Broken JSON and binary junk are counted, and analysis goes on."""
    lines = ['{"event": "provider_request", ', "\udcff\udcfe\x00", *chain("n1", 0, write=0.01)]
    report = analyze_lines(lines)
    assert report.summary.malformed_lines == 2
    assert report.summary.lines == 6
    assert report.summary.notifications == 1


def test_retry_after_finalization_is_still_a_duplicate() -> None:
    """A resend long after the notification was closed is matched against its earlier send."""
    options = AnalyzeOptions(window_s=1.0, window_lines=10)
    lines = chain("n1", 0, attempt=1, write=0.01)
    lines += [kline(2 + i, "enqueued", f"other-{i}") for i in range(3000)]
    lines += chain("n1", 3100, attempt=2, worker="w2", write=0.01)
    report = analyze_lines(lines, options=options)
    (dup,) = of_kind(report, "duplicate_request")
    assert dup.request_ids == ("n1-r1", "n1-r2")
    assert dup.proven is True
    assert report.summary.notifications == 3001


def test_incident_list_cap_keeps_exact_counts() -> None:
    """When the incident list is capped, summary counts stay exact and truncation is flagged."""
    lines = [line for n in range(5) for line in chain(f"n{n}", n, write=-1)]
    report = analyze_lines(lines, options=AnalyzeOptions(max_incidents=2))
    assert len(report.incidents) == 2
    assert report.incidents_truncated is True
    assert report.summary.late_writes == 5
    assert report.summary.incidents_total == 5


def _many(total: int, *, stamped: bool) -> Iterator[str]:
    """``total`` lines over many interleaved notifications; every 500th is a proven duplicate."""
    n = 0
    made = 0
    while made < total:
        at = n * 0.01
        lines = chain(f"n{n}", at, write=0.01)
        if n % 500 == 0:
            lines += chain(f"n{n}", at + 0.05, attempt=2, worker="w2", write=0.01)
        for line in lines:
            yield line if stamped else line.split(" ", 1)[1]
        made += len(lines)
        n += 1


@pytest.mark.parametrize(
    ("stamped", "options"),
    [(True, AnalyzeOptions()), (False, AnalyzeOptions(window_lines=4000))],
    ids=["log-time-window", "line-window"],
)
def test_open_state_stays_bounded(stamped: bool, options: AnalyzeOptions) -> None:
    """Over 200,000 lines (~50,000 notifications) only recently active ones hold state."""
    detector = Detector(options)
    most = 0
    for count, line in enumerate(_many(200_000, stamped=stamped), 1):
        detector.feed(line)
        if not count % 1000:
            most = max(most, detector.open_notifications)
    report = detector.finish()
    assert report.summary.notifications > 40_000
    assert most < 2_000
    assert report.summary.open_notifications_peak < 2_000
    assert detector.open_notifications == 0
    expected = len(range(0, report.summary.notifications, 500))
    assert report.summary.duplicates == expected
