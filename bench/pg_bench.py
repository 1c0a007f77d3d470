"""kirim on PostgreSQL: deliveries per second, and notify() → provider request latency.

Throughput is ``kirim.devtools.bench.run_bench`` on a throw-away database of the given server
(created, then dropped). Latency: one worker process idles on LISTEN (no burst, the
default poll interval of a second); the benchmark calls ``notify()`` one at a time,
lets the worker go idle again between samples, and times each notification from the
call to the moment the provider receives the request (``time.perf_counter`` is the
system-wide monotonic clock, comparable across the two processes).
Run alone: ``python bench/pg_bench.py --database URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kirim.channels import Channel
from kirim.config import Config
from kirim.devtools.bench import run_bench, scratch
from kirim.engine import Kirim
from kirim.observe.logging import configure
from kirim.providers.base import Message, Sent
from kirim.worker import WorkerSettings

IDLE_S = 0.05  # between samples: the worker is back waiting on LISTEN


class StampingProvider:
    """Accepts at once and reports when each request arrived."""

    idempotent = True

    def __init__(self, out: Any) -> None:
        self.out = out

    async def send(self, message: Message) -> Sent:
        self.out.put((message.event_id, time.perf_counter()))
        return Sent(provider_message_id=f"p-{message.delivery_id}")

    async def aclose(self) -> None:
        return None


def _app(url: str, provider: Any, listen_url: str | None = None) -> Kirim:
    return Kirim(
        Config(database=url, listen_url=listen_url),
        channels={"c": Channel(name="c", provider=provider)},
    )


def _worker(url: str, listen_url: str | None, ready: Any, stop: Any, out: Any) -> None:
    configure(level="warning")

    async def main() -> None:
        app = _app(url, StampingProvider(out), listen_url)
        await app.open()
        try:
            worker = app.worker(settings=WorkerSettings(poll_interval=1.0))
            running = asyncio.create_task(worker.run())
            await asyncio.wait_for(worker.waiting.wait(), 30)
            ready.release()
            await asyncio.get_running_loop().run_in_executor(None, stop.wait)
            worker.stop()
            await running
        finally:
            await app.close()

    asyncio.run(main())


async def _sample(url: str, samples: int, warmup: int, arrivals: Any) -> list[float]:
    app = _app(url, StampingProvider(None))
    await app.open()
    took = []
    try:
        for i in range(warmup + samples):
            await asyncio.sleep(IDLE_S)
            started = time.perf_counter()
            await app.notify(f"lat-{i}", "u", "c", {"i": i})
            event, arrived = await asyncio.to_thread(arrivals.get, True, 10)
            assert event == f"lat-{i}", event
            if i >= warmup:
                took.append(arrived - started)
    finally:
        await app.close()
    return took


def latency(
    database: str,
    samples: int = 300,
    warmup: int = 20,
    *,
    through: Callable[[str], str] | None = None,
    listen_direct: bool = False,
) -> dict[str, Any]:
    """p50/p99 from ``notify()`` to the provider's request, for an idle worker.

    ``through`` maps the throw-away database's URL to the one the app and the worker
    use (a pooler in front, bench/pooler_bench.py); ``listen_direct`` then gives the
    worker ``listen_url`` = the direct URL."""
    configure(level="warning")
    with tempfile.TemporaryDirectory() as tmp, scratch(database, Path(tmp)) as direct:
        asyncio.run(_migrate(direct))
        url = direct if through is None else through(direct)
        listen_url = direct if listen_direct else None
        ctx = mp.get_context("spawn")
        ready, stop, arrivals = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=_worker, args=(url, listen_url, ready, stop, arrivals))
        proc.start()
        try:
            if not ready.acquire(timeout=60):
                raise RuntimeError("the latency worker did not start")
            took = asyncio.run(_sample(url, samples, warmup, arrivals))
        finally:
            stop.set()
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    ms = sorted(t * 1000 for t in took)
    return {
        "samples": len(ms),
        "notify_to_request_ms_p50": round(statistics.median(ms), 2),
        "notify_to_request_ms_p99": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
        "notify_to_request_ms_max": round(ms[-1], 2),
    }


async def _migrate(url: str) -> None:
    app = _app(url, StampingProvider(None))
    await app.open(migrate=True)
    await app.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--notifications", type=int, default=20_000)
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    for workers in (1, 2):
        print(json.dumps(run_bench(args.database, args.notifications, workers)))
    print(json.dumps(latency(args.database, args.samples)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
