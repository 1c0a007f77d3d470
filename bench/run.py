"""`make bench`: kirim's figures on this machine. Prints; asserts nothing."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from kirim.bench import run_bench

HERE = Path(__file__).parent


def postgres_section(database: str, notifications: int, jobs: int) -> None:
    """kirim on PostgreSQL (1 and 2 workers), procrastinate beside it on the same
    server, the ratio, and notify() → provider request latency for an idle worker."""
    import pg_bench

    print("\n== PostgreSQL: kirim beside procrastinate (same server) ==", flush=True)
    try:  # latency first, on a quiet server
        latency = pg_bench.latency(database)
        kirim = [run_bench(database, notifications, w) for w in (1, 2)]
    except Exception as exc:  # no server: say so, measure the rest
        print(f"skipped: PostgreSQL at {database}: {exc}")
        return
    for result in kirim:
        print(json.dumps(result))
    try:
        import procrastinate_bench

        theirs = [procrastinate_bench.best(database, jobs, w, (1, 10, 50)) for w in (1, 2)]
    except ImportError:
        print("procrastinate: not installed (pip install -e '.[bench]'; `make bench` does)")
        theirs = []
    for result in theirs:
        print(json.dumps(result))
    for ours, other in zip(kirim, theirs, strict=False):
        ratio = ours["deliveries_per_s"] / other["jobs_per_s"]
        print(
            f"{ours['workers']} worker(s): kirim {ours['deliveries_per_s']:,.0f} deliveries/s "
            f"(full ledger) vs procrastinate {other['jobs_per_s']:,.0f} no-op jobs/s "
            f"(concurrency {other['concurrency']}): {ratio:.1f}x"
        )
    print(json.dumps(latency), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--notifications", type=int, default=20_000)
    parser.add_argument("--analyze-lines", type=int, default=1_000_000)
    parser.add_argument(
        "--database",
        default=os.environ.get("KIRIM_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="PostgreSQL server for the side-by-side (throw-away databases are made there)",
    )
    parser.add_argument("--jobs", type=int, default=5_000, help="procrastinate's no-op jobs")
    args = parser.parse_args()

    print("== SQLite: enqueue and deliver (zero-latency provider, full ledger) ==")
    for workers in (1, 2):
        result = run_bench(None, args.notifications, workers)
        print(json.dumps(result))
    postgres_section(args.database, args.notifications, args.jobs)
    print(
        "\n== kirim analyze ==",
        flush=True,
    )
    analyze = HERE / "analyze_bench.py"
    if analyze.exists():
        subprocess.run(
            [sys.executable, str(analyze), "--lines", str(args.analyze_lines)], check=True
        )
    print("\n== HTTP: POST /v1/notifications (kirim serve, one worker, SQLite) ==", flush=True)
    subprocess.run([sys.executable, str(HERE / "http_bench.py")], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
