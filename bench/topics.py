"""Benchmark a topic's fan-out: subscribers per second, SQLite and PostgreSQL.

Subscribes N recipients to one topic (written straight into the table: the setup is
not what is measured), records one event to it (``Kirim.notify_topic``), then times
one worker's ``TopicExpander`` expanding it to its end: each batch read at the mark by
keyset pagination, planned as ``notify_event`` plans (preferences and addresses read,
templates rendered) and recorded with its cursor in one transaction. Prints
subscribers/s and the peak RSS before and after (flat: one batch in memory at a time).

    python bench/topics.py [--subscribers N] [--batch B] [--postgres URL] [--json]

Without ``--postgres`` it runs on a SQLite file in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
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
from kirim.observe.logging import configure, get_logger
from kirim.providers.null import NullProvider
from kirim.worker.topics import BATCH, TopicExpander

TOPIC = "project:bench"
TYPE = parse_type("release_out", {"templates": {"push": {"title": "{{ version }} is out"}}})


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _subscribe_many(app: Kirim, n: int) -> None:
    """N live subscriptions at change numbers 1..N, written in one statement per
    10,000 (as N subscribes would leave them)."""
    rows = [(TOPIC, f"r{i:07d}", i + 1, 0.0) for i in range(n)]
    insert = (
        "INSERT INTO kirim_topic_subscriptions (topic, recipient_id, added_seq, added_at) "
        "VALUES ({})"
    )
    url = app.config.database
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url.split("///", 1)[1])
        conn.execute("INSERT INTO kirim_topics VALUES (?, ?, 0)", (TOPIC, n + 1))
        conn.executemany(insert.format("?, ?, ?, ?"), rows)
        conn.commit()
        conn.close()
        return
    import psycopg

    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("INSERT INTO kirim_topics VALUES (%s, %s, 0)", (TOPIC, n + 1))
        async with conn.cursor() as cur:
            await cur.executemany(insert.format("%s, %s, %s, %s"), rows)
        await conn.commit()


async def run(url: str, n: int, batch: int) -> dict[str, Any]:
    channels = {"push": Channel(name="push", provider=NullProvider())}
    app = Kirim(Config(database=url), channels=channels, types=[TYPE])
    await app.open(migrate=True)
    try:
        await _subscribe_many(app, n)
        event = await app.notify_topic("release_out", TOPIC, {"version": "0.3"}, event_id="rel")
        expander = TopicExpander(
            app.store,
            app.plan_topic_batch,
            worker_id="bench",
            clock=app.clock,
            lease=60.0,
            poll_interval=1.0,
            log=get_logger(worker_id="bench"),
            batch=batch,
        )
        before = rss_mib()
        started = time.perf_counter()
        assert await expander.step()
        took = time.perf_counter() - started
        info = await app.topic_info(TOPIC, recent=1)
        assert info is not None
        done = info.recent[0]
        assert done.id == event.id
        assert done.recipients == n, done
        return {
            "backend": url.split(":", 1)[0],
            "subscribers": n,
            "batch": batch,
            "seconds": round(took, 2),
            "subscribers_per_s": round(n / took),
            "peak_rss_mib_before": round(before, 1),
            "peak_rss_mib_after": round(rss_mib(), 1),
        }
    finally:
        await app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--postgres", metavar="URL", help="Run on PostgreSQL instead.")
    parser.add_argument("--json", action="store_true", help="Print one JSON object.")
    args = parser.parse_args()
    configure(level="warning")
    with tempfile.TemporaryDirectory() as tmp:
        if args.postgres:
            url = asyncio.run(fresh_postgres(args.postgres, "kirim_topics_bench"))
        else:
            url = f"sqlite:///{Path(tmp) / 'topics.db'}"
        result = asyncio.run(run(url, args.subscribers, args.batch))
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{result['backend']}: {result['subscribers']} subscribers in {result['seconds']} s "
        f"(batches of {result['batch']}): {result['subscribers_per_s']} subscribers/s; "
        f"peak RSS {result['peak_rss_mib_before']} -> {result['peak_rss_mib_after']} MiB"
    )


if __name__ == "__main__":
    main()
