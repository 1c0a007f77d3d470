"""Benchmark workflow runs taken to their end by one running worker, SQLite and
PostgreSQL.

Starts N runs of a type of three steps (``send inbox``, a branch on the event's data,
``send email`` to a provider that answers at once), then times one ``Worker.run`` (the
default poll interval, as ``kirim worker`` runs) until every run is done and both
of its deliveries are sent. Prints runs/s.

    python bench/runs.py [--runs N] [--postgres URL] [--json]

Without ``--postgres`` it runs on a SQLite file in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fresh_db import fresh_postgres

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.notify import parse_type
from kirim.observe.logging import configure
from kirim.providers.inbox import InboxProvider
from kirim.providers.null import NullProvider

TYPE = parse_type(
    "escalate",
    {
        "templates": {
            "inbox": {"title": "Order {{ order_id }} needs you", "body": "Open it."},
            "email": {"subject": "Order {{ order_id }} needs you", "body": "Open it."},
        },
        "steps": [
            {"send": "inbox"},
            {"branch": "data", "field": "vip", "equals": True},
            {"send": "email"},
        ],
    },
)


async def run(url: str, n: int) -> dict[str, Any]:
    channels = {
        "inbox": Channel(name="inbox", provider=InboxProvider()),
        "email": Channel(name="email", provider=NullProvider()),
    }
    app = Kirim(Config(database=url), channels=channels, types=[TYPE])
    await app.open(migrate=True)
    try:
        for start in range(0, n, 500):
            recipients = [f"u{i}" for i in range(start, min(n, start + 500))]
            await app.notify_event(
                "escalate", recipients, {"order_id": "o1", "vip": True}, event_id="e1"
            )
        worker = app.worker()
        started = time.perf_counter()
        task = asyncio.create_task(worker.run())
        while True:
            runs = await app.store.run_counts()
            sent = (await app.store.counts())["deliveries"].get("sent", 0)
            if runs.get("done", 0) == n and sent == 2 * n:
                break
            await asyncio.sleep(0.05)
        took = time.perf_counter() - started
        worker.stop()
        await task
        return {
            "backend": url.split(":", 1)[0],
            "runs": n,
            "seconds": round(took, 2),
            "runs_per_s": round(n / took),
        }
    finally:
        await app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--postgres", metavar="URL", help="Run on PostgreSQL instead.")
    parser.add_argument("--json", action="store_true", help="Print one JSON object.")
    args = parser.parse_args()
    configure(level="warning")
    with tempfile.TemporaryDirectory() as tmp:
        if args.postgres:
            url = asyncio.run(fresh_postgres(args.postgres, "kirim_runs_bench"))
        else:
            url = f"sqlite:///{Path(tmp) / 'runs.db'}"
        result = asyncio.run(run(url, args.runs))
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{result['backend']}: {result['runs']} runs in {result['seconds']} s "
        f"({result['runs_per_s']}/s)"
    )


if __name__ == "__main__":
    main()
