"""Wake-up latency behind PgBouncer in transaction mode, with and without ``listen_url``.

An idle worker (poll interval 1 s) and ``notify()`` one at a time, as in
bench/pg_bench.py's latency, three ways: straight to the server; through a PgBouncer
(``pool_mode = transaction``, started here from tests/pgbouncer.py, stopped at the
end) with LISTEN through it too; and through it with ``listen_url`` pointing LISTEN at
the server directly. Prints one JSON line each, then the figures. Needs Debian's
``pgbouncer`` (``make test`` installs it). Run: ``python bench/pooler_bench.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pg_bench

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from pgbouncer import Bouncer, pooled_url, unavailable


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--samples", type=int, default=100)
    args = parser.parse_args()
    why = unavailable()
    if why is not None:
        print(f"skipped: {why}")
        return 0
    server = urlsplit(args.database)
    pooler = Bouncer(host=server.hostname or "127.0.0.1", port=server.port or 5432)
    try:
        pooler.start()
        runs = {
            "direct": pg_bench.latency(args.database, args.samples),
            "pgbouncer, LISTEN through it": pg_bench.latency(
                args.database, args.samples, through=lambda url: pooled_url(url, pooler)
            ),
            "pgbouncer, listen_url direct": pg_bench.latency(
                args.database,
                args.samples,
                through=lambda url: pooled_url(url, pooler),
                listen_direct=True,
            ),
        }
    finally:
        pooler.stop()
    for name, result in runs.items():
        print(json.dumps({"route": name, **result}))
    for name, result in runs.items():
        print(
            f"{name}: notify() -> provider request p50 {result['notify_to_request_ms_p50']} ms, "
            f"p99 {result['notify_to_request_ms_p99']} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
