"""SSE fan-out: the time from one new feed message to ``--streams`` open streams of
its recipient having it, on loopback. A bounded run (it stops by itself); prints, asserts
nothing.

For each backend (a temporary SQLite file; a throw-away PostgreSQL database on the
server of ``--postgres``, dropped after): ``kirim serve``'s app runs in a child process
(uvicorn on 127.0.0.1); this process opens ``--streams`` streams of one recipient
(plain asyncio sockets, each reading its events as a browser would) and, once each has
had its first event, ``--rounds`` times: a worker of this process (another process
than the server's, as in production) delivers one inbox message, and each stream's
time from the start of that delivery to its ``message`` event is recorded. On
PostgreSQL the server hears of the commit by LISTEN/NOTIFY; on SQLite by its
once-a-second look at the feed's counter (so SQLite's figure is mostly that second).
Then ``--rounds`` marks (read, unread) made through the served API, which the server
hears of itself (``on_feed_change``), to every stream's ``state`` event: the fan-out
alone. Printed: p50, p99 and the last stream's time per round, over all rounds.

Run alone: ``python bench/sse_fanout_bench.py [--streams 1000] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from kirim.channels import Channel
from kirim.config import Config, InboxSettings
from kirim.engine import Kirim
from kirim.observe.logging import configure
from kirim.providers.inbox import InboxProvider
from kirim.simulate.harness import scratch_database
from kirim.worker import WorkerSettings

SECRET = "bench-secret-0123456789abcdef0123"
RID = "bench-user"
#: a bound on every wait of the run
BOUND = 60.0


def _kirim(url: str) -> Kirim:
    config = Config(database=url, inbox=InboxSettings(secret=SECRET))
    return Kirim(config, channels={"inbox": Channel(name="inbox", provider=InboxProvider())})


def serve(url: str, port: int) -> None:
    """The child: kirim's app on 127.0.0.1:port until it is terminated."""
    import uvicorn

    from kirim.http import create_app

    configure(level="warning")
    uvicorn.run(create_app(_kirim(url)), host="127.0.0.1", port=port, log_level="warning")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _stream(port: int, token: str, ready: asyncio.Event, got: asyncio.Queue[float]) -> None:
    """One stream: report ready after its first event, then the time of each message or
    state change."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    path = f"/v1/recipients/{RID}/feed/stream?token={token}"
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            if line.startswith(b"event: counts") and not ready.is_set():
                ready.set()
            elif line.startswith((b"event: message", b"event: state")):
                got.put_nowait(time.monotonic())
    finally:
        writer.close()


def _start_server(url: str, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--serve", url, str(port)])


async def measure(url: str, streams: int, rounds: int) -> dict[str, Any]:
    app = _kirim(url)
    await app.open(migrate=True)
    port = _free_port()
    child = _start_server(url, port)
    tasks: list[asyncio.Task[None]] = []
    try:
        for _ in range(int(BOUND / 0.1)):
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            await asyncio.sleep(0.1)
        token = app.feed_token(RID, ttl=3600)[0]
        readies = [asyncio.Event() for _ in range(streams)]
        queues: list[asyncio.Queue[float]] = [asyncio.Queue() for _ in range(streams)]
        opened = time.monotonic()
        tasks = [
            asyncio.create_task(_stream(port, token, readies[i], queues[i])) for i in range(streams)
        ]
        async with asyncio.timeout(BOUND):
            await asyncio.gather(*(r.wait() for r in readies))
        open_s = time.monotonic() - opened
        worker = app.worker(settings=WorkerSettings(lease=30.0))
        per_round: list[list[float]] = []
        for n in range(rounds):
            await app.notify(f"bench-{n}", RID, "inbox", {"title": f"message {n}"})
            start = time.monotonic()
            while await worker.run_once():
                pass
            async with asyncio.timeout(BOUND):
                arrived = await asyncio.gather(*(q.get() for q in queues))
            per_round.append(sorted(t - start for t in arrived))
        # a mark made through the served API: the server wakes its streams itself
        marks: list[list[float]] = []
        item = (await app.feed(RID, limit=1)).items[0].id
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=BOUND) as api:
            for n in range(rounds):
                verb = "read" if n % 2 == 0 else "unread"
                start = time.monotonic()
                answer = await api.post(
                    f"/v1/recipients/{RID}/feed/{item}/{verb}", params={"token": token}
                )
                answer.raise_for_status()
                async with asyncio.timeout(BOUND):
                    arrived = await asyncio.gather(*(q.get() for q in queues))
                marks.append(sorted(t - start for t in arrived))
        every = sorted(t for r in per_round for t in r)
        marked = sorted(t for r in marks for t in r)
        return {
            "backend": "sqlite" if url.startswith("sqlite:") else "postgres",
            "streams": streams,
            "rounds": rounds,
            "open_all_s": round(open_s, 3),
            "p50_ms": round(1000 * statistics.median(every), 1),
            "p99_ms": round(1000 * every[int(0.99 * (len(every) - 1))], 1),
            "last_stream_ms_per_round": [round(1000 * r[-1], 1) for r in per_round],
            "mark_via_api_p50_ms": round(1000 * statistics.median(marked), 1),
            "mark_via_api_p99_ms": round(1000 * marked[int(0.99 * (len(marked) - 1))], 1),
            "mark_via_api_last_ms_per_round": [round(1000 * r[-1], 1) for r in marks],
        }
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
        await app.close()


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    configure(level="warning")
    urls = [None] if args.no_postgres else [None, args.postgres]
    for given in urls:
        with tempfile.TemporaryDirectory() as tmp, scratch_database(given, Path(tmp)) as url:
            print(json.dumps(asyncio.run(measure(url, args.streams, args.rounds))), flush=True)


if __name__ == "__main__":
    main()
