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
from typing import Any

from kirim.channels import Channel
from kirim.keys import canonical_json, payload_hash
from kirim.model import Delivery
from kirim.store import open_store
from kirim.store.base import DigestEvent, NewDelivery, Throttle
from kirim.testing import FlakyProvider, ManualClock
from kirim.worker import Worker, WorkerSettings

START = 1_800_000_000.0
WINDOW = 600.0
STREAM = "liked|u1|email|u1"
LIMIT = 5
HOUR = 3600.0


def digest_event(i: int) -> NewDelivery:
    text = canonical_json({"type": "liked", "digest": STREAM, "events": []})
    return NewDelivery(
        idempotency_key=f"unused-{i}",
        event_id=f"e{i}",
        recipient="u1@example.com",
        channel="email",
        payload_json=text,
        payload_hash=payload_hash(text),
        run_at=None,
        max_attempts=3,
        type="liked",
        recipient_id="u1",
        digest=DigestEvent(
            stream=STREAM, window=WINDOW, event_id=f"e{i}", data_json=canonical_json({"i": i})
        ),
    )


def throttled(i: int, over: Any) -> NewDelivery:
    text = canonical_json({"i": i})
    return NewDelivery(
        idempotency_key=f"k{i}",
        event_id=f"e{i}",
        recipient="u1@example.com",
        channel="email",
        payload_json=text,
        payload_hash=payload_hash(text),
        run_at=None,
        max_attempts=3,
        type="order_shipped",
        recipient_id="u1",
        throttle=Throttle(scope="recipient:u1:email", limit=LIMIT, window=HOUR, over=over),
    )


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
