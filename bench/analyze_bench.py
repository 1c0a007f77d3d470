"""Benchmark ``kirim analyze``: throughput (lines/s) and peak RSS at N and 2N lines.

Generates kirim-style logfmt (most notifications clean; a few transient retries,
lease-expiry duplicates, provider-deduplicated resends, late and missing status writes)
into temp files, analyzes N lines and then 2N lines in-process, and prints lines/s and
peak RSS (``resource.getrusage``) after each run: flat RSS means memory is bounded by
open notifications, not input size.

    python bench/analyze_bench.py [--lines N] [--json] [--max-incidents K]

Peak RSS between N and 2N grows only by the incident list the report keeps (capped at
``max_incidents``); ``--max-incidents 0`` shows the detector's own state staying flat.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import os
import random
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kirim.analyze import AnalyzeOptions, analyze_paths

START = datetime(2026, 7, 21, 10, 0, tzinfo=UTC).timestamp()
_DAYS: dict[int, str] = {}


def fmt_ts(t: float) -> str:
    """``YYYY-MM-DDTHH:MM:SS.fffZ`` for epoch seconds ``t``."""
    ms = round(t * 1000)
    day, rest = divmod(ms, 86_400_000)
    prefix = _DAYS.get(day)
    if prefix is None:
        prefix = _DAYS[day] = datetime.fromtimestamp(day * 86_400, UTC).strftime("%Y-%m-%dT")
    hours, rest = divmod(rest, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    return f"{prefix}{hours:02d}:{minutes:02d}:{seconds:02d}.{millis:03d}Z"


def _chain(rng: random.Random, n: int, t0: float) -> list[tuple[float, str]]:
    """The events of notification ``n`` as (time, logfmt body without ts)."""
    nid, job = f"ntf-{n:08d}", f"job-{n:08d}"
    key = hashlib.sha256(f"event:{n}:user:{n % 9973}:channel:push".encode()).hexdigest()
    common = f"notification_id={nid} event_id=ev-{n:08d} job_id={job}"
    roll = rng.random()
    out: list[tuple[float, str]] = [
        (t0, f"level=info event=enqueued {common} idempotency_key={key}")
    ]

    def attempt(number: int, t: float, latency: float, result: str, msg: str | None) -> float:
        worker = f"w-{rng.randrange(16)}"
        ids = f"{common} attempt={number} worker_id={worker} idempotency_key={key}"
        rid = f"preq-{n:08d}-{number}"
        out.append((t, f"level=info event=job_claimed {ids}"))
        out.append(
            (t + 0.002, f"level=info event=provider_request {ids} provider_request_id={rid}")
        )
        tail = f" provider_message_id={msg}" if msg else ""
        body = f"result={result} latency_s={latency:.3f}{tail}"
        out.append((t + 0.002 + latency, f"level=info event=provider_response {ids} {body}"))
        return t + 0.002 + latency

    t = t0 + rng.uniform(0.005, 0.2)
    lat = min(rng.lognormvariate(-1.4, 0.6), 4.0)
    if roll < 0.003:  # transient failure, then a clean retry after backoff
        done = attempt(1, t, lat, "failed_transient", None)
        out.append((done + 0.004, f"level=warning event=db_update {common} status=pending"))
        out.append((done + 0.005, f"level=info event=retry_scheduled {common} attempt=1"))
        done = attempt(2, done + rng.uniform(1.0, 3.0), lat, "success", f"pm-{n}-2")
        out.append((done + 0.01, f"level=info event=db_update {common} status=sent"))
    elif roll < 0.005:  # lease expiry: a second worker sends while the first is in flight
        msg2 = f"pm-{n}-1" if roll < 0.004 else f"pm-{n}-2"  # half deduplicated by provider
        attempt(1, t, 6.0, "success", f"pm-{n}-1")
        out.append((t + 5.0, f"level=warning event=lease_expired {common} attempt=1"))
        done = attempt(2, t + 5.05, lat, "success", msg2)
        out.append((t + 6.01, f"level=info event=db_update {common} status=sent"))
        out.append((done + 0.01, f"level=info event=db_update {common} status=sent"))
    else:
        done = attempt(1, t, lat, "success", f"pm-{n}-1")
        if roll < 0.007:  # late status write
            out.append(
                (done + rng.uniform(1.5, 4.0), f"level=info event=db_update {common} status=sent")
            )
        elif roll > 0.9995:  # worker died before writing the status: never written
            pass
        else:
            out.append(
                (
                    done + rng.uniform(0.003, 0.03),
                    f"level=info event=db_update {common} status=sent",
                )
            )
    return out


def generate(total: int, seed: int = 7) -> Iterator[str]:
    """Yield ``total`` kirim logfmt lines in time order (one new notification per ~1.2 ms)."""
    rng = random.Random(seed)
    pending: list[tuple[float, int, str]] = []
    seq = produced = n = 0
    t_next = START
    while produced < total:
        while not pending or pending[0][0] >= t_next:
            for when, body in _chain(rng, n, t_next):
                heapq.heappush(pending, (when, seq, body))
                seq += 1
            n += 1
            t_next += rng.expovariate(1 / 0.0012)
        when, _, body = heapq.heappop(pending)
        yield f"ts={fmt_ts(when)} {body}\n"
        produced += 1


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(kib / 1024 if sys.platform != "darwin" else kib / 1024 / 1024, 1)


def run(paths: list[str], lines: int, options: AnalyzeOptions) -> dict[str, object]:
    started = time.perf_counter()
    report = analyze_paths(paths, options=options)
    elapsed = time.perf_counter() - started
    s = report.summary
    return {
        "lines": s.lines,
        "expected_lines": lines,
        "seconds": round(elapsed, 2),
        "lines_per_s": round(s.lines / elapsed),
        "peak_rss_mb": peak_rss_mb(),
        "open_notifications_peak": s.open_notifications_peak,
        "incidents_kept": len(report.incidents),
        "notifications": s.notifications,
        "duplicates": s.duplicates,
        "duplicate_risks": s.duplicate_risks,
        "overlaps": s.overlaps,
        "late_writes": s.late_writes,
        "provider_latency_p99_s": s.provider_latency_p99_s,
        "suggested_lease_s": s.suggested_lease_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000, help="N (default 1,000,000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--max-incidents",
        type=int,
        default=AnalyzeOptions().max_incidents,
        help="incidents kept in the report (0 isolates the detector's own memory)",
    )
    args = parser.parse_args()
    lines: int = args.lines
    options = AnalyzeOptions(max_incidents=args.max_incidents)
    with tempfile.TemporaryDirectory(prefix="kirim-analyze-bench-") as tmp:
        parts = [os.path.join(tmp, "part1.log"), os.path.join(tmp, "part2.log")]
        started = time.perf_counter()
        stream = generate(2 * lines)
        for part in parts:
            with open(part, "w", encoding="ascii") as handle:
                handle.writelines(next(stream) for _ in range(lines))
        generated_s = round(time.perf_counter() - started, 1)
        baseline = peak_rss_mb()
        first = run(parts[:1], lines, options)
        second = run(parts, 2 * lines, options)
        size = sum(os.path.getsize(p) for p in parts)
    result = {
        "generated_lines": 2 * lines,
        "generated_mb": round(size / 1024 / 1024, 1),
        "generate_s": generated_s,
        "baseline_peak_rss_mb": baseline,
        "n": first,
        "2n": second,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"generated {2 * lines:,} lines ({result['generated_mb']} MiB) in {generated_s} s")
    print(f"baseline peak RSS: {baseline} MiB")
    for label, row in (("N", first), ("2N", second)):
        print(
            f"{label:>2}: {row['lines']:,} lines in {row['seconds']} s = "
            f"{row['lines_per_s']:,} lines/s, peak RSS {row['peak_rss_mb']} MiB, "
            f"open notifications peak {row['open_notifications_peak']:,}, "
            f"incidents kept {row['incidents_kept']:,}, "
            f"duplicates {row['duplicates']}, risks {row['duplicate_risks']}, "
            f"overlaps {row['overlaps']}, late writes {row['late_writes']}, "
            f"p99 {row['provider_latency_p99_s']} s -> lease {row['suggested_lease_s']} s"
        )


if __name__ == "__main__":
    main()
