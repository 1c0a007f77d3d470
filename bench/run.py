"""`make bench`: kirim's figures on this machine. Prints; asserts nothing.

Each of kirim's figures is printed beside a raw loop of the same durability measured in
the same run (bench/raw.py), as a ratio: SQLite's one-by-one claim loop and
PostgreSQL's batched SKIP LOCKED loop for deliveries, a raw executemany of delivery and
job rows for enqueues.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from raw import postgres_raw, sqlite_raw

from kirim.devtools.bench import run_bench

HERE = Path(__file__).parent


def as_ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}x" if ours and theirs else "n/a"


def rate(value: float | None) -> str:
    return f"{value:,.0f}/s" if value is not None else "n/a"


def plural(workers: int) -> str:
    return f"{workers} worker" + ("" if workers == 1 else "s")


def sqlite_section(notifications: int) -> None:
    """kirim on SQLite at synchronous=normal (1, 2 and 4 workers) and full (1 worker),
    beside the raw one-by-one loop and the raw executemany at the same setting."""
    print(
        "== SQLite: kirim (zero-latency provider, full ledger) beside raw loops of the same "
        "pragmas ==",
        flush=True,
    )
    raw = {sync: sqlite_raw(notifications, sync) for sync in ("normal", "full")}
    runs = [("normal", 1), ("normal", 2), ("normal", 4), ("full", 1)]
    kirim = {(sync, w): run_bench(None, notifications, w, sync=sync) for sync, w in runs}
    for result in [*raw.values(), *kirim.values()]:
        print(json.dumps(result))
    for (sync, workers), ours in kirim.items():
        theirs = raw[sync]["claims_per_s"]
        print(
            f"sqlite {sync}: kirim {plural(workers)} {rate(ours['deliveries_per_s'])} vs raw "
            f"one-by-one loop {rate(theirs)}: {as_ratio(ours['deliveries_per_s'], theirs)}"
        )
    for sync in raw:
        ours, theirs = kirim[(sync, 1)]["enqueues_per_s"], raw[sync]["executemany_inserts_per_s"]
        print(
            f"sqlite {sync} enqueue: kirim {rate(ours)} vs raw executemany {rate(theirs)}: "
            f"{as_ratio(ours, theirs)}"
        )


def postgres_section(database: str, notifications: int, jobs: int) -> None:
    """kirim on PostgreSQL (1 and 2 workers) beside the raw batched SKIP LOCKED loop and
    procrastinate on the same server, the ratios, and notify() → provider request
    latency for an idle worker."""
    import pg_bench

    print(
        "\n== PostgreSQL: kirim beside a raw SKIP LOCKED loop and procrastinate (same server) ==",
        flush=True,
    )
    try:  # latency first, on a quiet server
        latency = pg_bench.latency(database)
        kirim = [run_bench(database, notifications, w) for w in (1, 2)]
        raw = postgres_raw(database, notifications)
    except Exception as exc:  # no server: say so, measure the rest
        print(f"skipped: PostgreSQL at {database}: {exc}")
        return
    for result in [raw, *kirim]:
        print(json.dumps(result))
    for ours in kirim:
        print(
            f"postgresql: kirim {plural(ours['workers'])} {rate(ours['deliveries_per_s'])} vs "
            f"raw batched loop (batch {raw['batch']}) {rate(raw['claims_per_s'])}: "
            f"{as_ratio(ours['deliveries_per_s'], raw['claims_per_s'])}"
        )
        server = ours.get("server_cpu_us_per_delivery")
        print(
            f"postgresql CPU per delivery, {plural(ours['workers'])}: "
            f"workers {ours['worker_cpu_us_per_delivery']} us + server "
            + (f"{server} us (on this host: they share its CPUs)" if server else "not measured")
        )
    ours_in, raw_in = kirim[0]["enqueues_per_s"], raw["executemany_inserts_per_s"]
    print(
        f"postgresql enqueue: kirim {rate(ours_in)} vs raw executemany {rate(raw_in)}: "
        f"{as_ratio(ours_in, raw_in)}"
    )
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
    parser.add_argument(
        "--http-requests", type=int, default=20_000, help="bench/http_bench.py --requests"
    )
    args = parser.parse_args()

    sqlite_section(args.notifications)
    postgres_section(args.database, args.notifications, args.jobs)
    print(
        "\n== PostgreSQL behind PgBouncer (transaction mode): wake-up latency, with and "
        "without listen_url ==",
        flush=True,
    )
    subprocess.run(
        [sys.executable, str(HERE / "pooler_bench.py"), "--database", args.database], check=True
    )
    print(
        "\n== PostgreSQL: the server's time and WAL by statement (a private server, one worker) ==",
        flush=True,
    )
    subprocess.run([sys.executable, str(HERE / "statement_costs.py")], check=True)
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
    subprocess.run(
        [sys.executable, str(HERE / "http_bench.py"), "--requests", str(args.http_requests)],
        check=True,
    )
    print("\n== Workflow runs to done, both deliveries sent (one worker) ==", flush=True)
    runs = HERE / "runs.py"
    subprocess.run([sys.executable, str(runs)], check=True)
    subprocess.run([sys.executable, str(runs), "--postgres", args.database], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
