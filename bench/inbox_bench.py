"""Messages per second into the in-app inbox's feeds: a bounded loop. Prints; asserts
nothing.

For each backend (a temporary SQLite file at ``synchronous=full``; a throw-away
PostgreSQL database on the server of ``--postgres``, dropped after): ``--messages``
notifications to an ``inbox`` channel, spread over ``--recipients`` recipients, are
enqueued in batches of 500 (``notify_many``), then one worker delivers them in-process
until none is due: each delivery claims, writes its intent, renders, and writes its
feed message in the commit that marks it sent. Printed: enqueues/s, messages/s into
the feeds (the worker's whole time), and a check that every key has exactly one
message.

Run alone: ``python bench/inbox_bench.py [--messages 5000] [--postgres URL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim, NotifyRequest
from kirim.observe.logging import configure
from kirim.providers.inbox import InboxProvider
from kirim.simulate.harness import scratch_database
from kirim.worker import WorkerSettings

BATCH = 500


async def measure(url: str, messages: int, recipients: int) -> dict[str, Any]:
    channels = {"inbox": Channel(name="inbox", provider=InboxProvider())}
    app = Kirim(Config(database=url), channels=channels)
    await app.open(migrate=True)
    try:
        t0 = time.perf_counter()
        for start in range(0, messages, BATCH):
            batch = [
                NotifyRequest(
                    event_id=f"m-{i}",
                    recipient=f"r-{i % recipients}",
                    channel="inbox",
                    payload={"title": f"message {i}", "body": "hello", "data": {"i": i}},
                )
                for i in range(start, min(messages, start + BATCH))
            ]
            await app.notify_many(batch)
        enqueued = time.perf_counter() - t0
        worker = app.worker(settings=WorkerSettings(concurrency=100, batch_size=50))
        t1 = time.perf_counter()
        while await worker.run_once():
            pass
        delivered = time.perf_counter() - t1
        in_feeds = 0
        for r in range(recipients):
            before = None
            while True:
                page = await app.feed(f"r-{r}", filter="all", limit=200, before=before)
                in_feeds += len(page.items)
                if page.next_before is None:
                    break
                before = page.next_before
        return {
            "backend": url.split(":", 1)[0],
            "messages": messages,
            "recipients": recipients,
            "enqueues_per_s": round(messages / enqueued),
            "feed_messages_per_s": round(messages / delivered),
            "in_feeds": in_feeds,
            "exactly_once": in_feeds == messages,
        }
    finally:
        await app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--recipients", type=int, default=50)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    configure(level="warning")
    results = []
    with tempfile.TemporaryDirectory() as folder:
        urls = [None] if args.no_postgres else [None, args.postgres]
        for given in urls:
            with scratch_database(given, Path(folder)) as url:
                results.append(asyncio.run(measure(url, args.messages, args.recipients)))
    for r in results:
        if args.json:
            print(json.dumps(r))
        else:
            print(
                f"{r['backend']}: {r['messages']:,} inbox messages to {r['recipients']} "
                f"recipients: enqueue {r['enqueues_per_s']:,}/s, into the feeds "
                f"{r['feed_messages_per_s']:,} messages/s (1 worker); "
                f"{r['in_feeds']:,} in the feeds, exactly once: {r['exactly_once']}"
            )


if __name__ == "__main__":
    main()
