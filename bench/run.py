"""`make bench`: kirim's figures on this machine. Prints; asserts nothing."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from kirim.bench import run_bench

HERE = Path(__file__).parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--notifications", type=int, default=20_000)
    parser.add_argument("--analyze-lines", type=int, default=1_000_000)
    args = parser.parse_args()

    print("== SQLite: enqueue and deliver (zero-latency provider, full ledger) ==")
    for workers in (1, 2):
        result = run_bench(None, args.notifications, workers)
        print(json.dumps(result))
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
