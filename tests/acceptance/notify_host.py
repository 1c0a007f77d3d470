"""One host of the notification-layer process tests (``test_notify_processes``).

``python notify_host.py URL ROLE FIRST LAST``: opens the store, prints ``ready``, waits
for a line on stdin, then plays ROLE and prints ``done``:

- ``digest``: events ``e{FIRST}`` .. ``e{LAST - 1}`` for one digest stream, one
  transaction each, stamped inside one window (the store's time is the caller's);
  prints ``half`` when half are in;
- ``suppress`` / ``defer``: deliveries ``k{FIRST}`` .. for one recipient under a
  throttle of ``LIMIT`` per window, one transaction each;
- ``seal``: a worker claims the window's digest at its end, seals it and sends it.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: notify_kit

from kirim.channels import Channel
from kirim.model import Delivery
from kirim.store import open_store
from kirim.store.base import NewDelivery, Throttle
from kirim.testing import FlakyProvider, ManualClock
from kirim.worker import Worker, WorkerSettings
from notify_kit import WINDOW, event, typed

START = 1_800_000_000.0
LIMIT = 5
HOUR = 3600.0


def digest_event(i: int) -> NewDelivery:
    return event(f"e{i}", i=i)


def throttled(i: int, over: Any) -> NewDelivery:
    rule = Throttle(scope="recipient:u1:email", limit=LIMIT, window=HOUR, over=over)
    return typed(f"k{i}", type="order_shipped", throttle=rule, event_id=f"e{i}")


def listing(d: Delivery, events: list[dict[str, Any]]) -> Any:
    return {"events": [e["event_id"] for e in events]}


async def main(url: str, role: str, first: int, last: int) -> None:
    store = open_store(url)
    await store.open()
    await store.migrate()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    try:
        if role == "seal":
            clock = ManualClock(START + WINDOW)
            channel = Channel(name="email", provider=FlakyProvider())
            worker = Worker(
                store,
                {"email": channel},
                settings=WorkerSettings(lease=30.0),
                worker_id=f"seal-{first}",
                clock=clock,
                digests={"liked": listing},
            )
            while not await worker.run_once():
                pass
        for n, i in enumerate(range(first, last)):
            if role == "digest":
                await store.enqueue([digest_event(i)], now=START + 1 + n * 0.001)
                if n == (last - first) // 2:
                    print("half", flush=True)
            elif role in ("suppress", "defer"):
                await store.enqueue([throttled(i, role)], now=START + 1)
    finally:
        await store.close()
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
