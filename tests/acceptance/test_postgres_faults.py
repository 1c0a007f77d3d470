"""PostgreSQL going away under real worker processes, on a private throw-away server.

The server is restarted (cleanly, or as a crash) while deliveries are in flight, or
stopped while a worker holds leases; nothing may be lost or sent twice, and the
workers must outlive the outage. The shared test server is never touched: each test
gets its own cluster from ``tests/pgserver.py``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from test_postgres_processes import write_pg_config
from test_processes import enqueue, wait_until

from kirim.channels import Channel
from kirim.config import load_config
from kirim.devtools.receiver import Behaviour, Receiver
from kirim.engine import Kirim, NotifyRequest
from kirim.providers.base import Message
from kirim.store.base import Lease
from kirim.store.postgres import PostgresStore
from kirim.testing import FlakyProvider
from kirim.worker import Worker as KirimWorker
from kirim.worker.settings import WorkerSettings
from notify_kit import numbered
from pgserver import PrivateServer, private_server

pytestmark = pytest.mark.slow


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[PrivateServer]:
    """A private PostgreSQL server for this test alone (always stopped at the end)."""
    yield from private_server(request)


class Worker:
    """``kirim worker`` in a process of its own, its JSON log lines read as they come."""

    def __init__(self, config: Path, *args: str) -> None:
        self.events: list[dict[str, Any]] = []
        self.other: list[str] = []  # lines that are not JSON (tracebacks)
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "kirim", "--config", str(config),
                "--log-format", "json", "--log-level", "info", "worker", *args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr as lines:
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:
                    event = None
                with self._lock:
                    if isinstance(event, dict):
                        self.events.append(event)
                    else:
                        self.other.append(line)

    def names(self) -> list[str]:
        with self._lock:
            return [str(e.get("event")) for e in self.events]

    def count(self, name: str) -> int:
        return self.names().count(name)

    def since(self, index: int) -> list[str]:
        return self.names()[index:]

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code

    def log(self) -> str:
        with self._lock:
            lines = [json.dumps(e) for e in self.events[-40:]]
            return "\n".join(lines + self.other[-40:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)


@contextlib.contextmanager
def workers(config: Path, n: int, *args: str) -> Iterator[list[Worker]]:
    started = [Worker(config, *args) for _ in range(n)]
    try:
        yield started
    finally:
        for w in started:
            w.kill()


def enqueue_later(config: Path, n: int, *, delay: float) -> None:
    """``n`` notifications after the first 4 keys of ``enqueue``, due in ``delay`` s."""

    async def main() -> None:
        app = Kirim(load_config(config))
        await app.open(migrate=True)
        try:
            await app.notify_many(
                [
                    NotifyRequest(
                        event_id=f"e{i}",
                        recipient=f"u{i}",
                        channel="push",
                        payload={"i": i},
                        send_after=timedelta(seconds=delay),
                    )
                    for i in range(4, 4 + n)
                ]
            )
        finally:
            await app.close()

    asyncio.run(main())


def statuses_of(database: str) -> set[str]:
    return {status for status, _ in ledger(database).values()}


def ledger(database: str) -> dict[str, tuple[str, str | None]]:
    """idempotency key -> (status, doubt) of every delivery."""
    with psycopg.connect(database) as conn:
        found = conn.execute(
            "SELECT idempotency_key, status, doubt FROM kirim_deliveries"
        ).fetchall()
    return {str(key): (str(status), doubt) for key, status, doubt in found}


def assert_each_once(receiver: Receiver, database: str, n: int) -> dict[str, int]:
    """No key reached the receiver twice, every delivery is sent, and every one the
    receiver never saw is reported (assumed sent: its request may have left)."""
    assert receiver.duplicates() == 0
    rows = ledger(database)
    assert len(rows) == n
    assert {status for status, _ in rows.values()} == {"sent"}, rows
    seen = set(receiver.requests)
    unseen = {key: doubt for key, (_, doubt) in rows.items() if key not in seen}
    assert all(doubt == "assumed_sent" for doubt in unseen.values()), unseen
    return {"delivered": receiver.delivered(), "assumed_sent": len(unseen)}


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_restart_mid_run_loses_nothing_and_duplicates_nothing(
    server: PrivateServer, tmp_path: Path, mode: str
) -> None:
    """A PostgreSQL restart (clean, or a crash) while two workers have deliveries in
    flight: both reconnect and finish, every notification is sent or reported in doubt,
    and the receiver sees no key twice."""
    n = 1500
    database = server.create_database("kirim")
    behaviour = Behaviour(latency=lambda rng: rng.uniform(0.005, 0.015))
    with Receiver(behaviour, seed=21) as receiver:
        config = write_pg_config(tmp_path, database, receiver.url, lease=3)
        enqueue(config, n)
        with workers(config, 2, "--burst", "--concurrency", "16") as running:
            wait_until(lambda: receiver.delivered() >= 300, 30)
            # Requests in flight across the stop: their answers come while the database
            # is away (their commits wait for it, or fail and are retried).
            receiver.hold()
            wait_until(lambda: receiver.in_flight >= 2, 10)
            server.stop(mode)
            receiver.release()
            # Away for longer than two heartbeat periods (1 s) past half the lease: a
            # renewal certainly fails (at once, or by its timeout) while it is away.
            time.sleep(4.0)
            assert receiver.delivered() < n  # it did land mid-run
            server.start()
            for w in running:
                assert w.wait(timeout=90) == 0, w.log()
        figures = assert_each_once(receiver, database, n)
    assert figures["delivered"] + figures["assumed_sent"] == n
    counts = collections.Counter(name for w in running for name in w.names())
    assert counts["lease_renewal_failing"] > 0, counts  # they did see it


def test_outage_stops_claims_until_the_database_is_back(
    server: PrivateServer, tmp_path: Path
) -> None:
    """A worker whose database goes away while it holds leases says it cannot renew
    them, claims nothing new while it cannot (though work falls due and it has free
    slots), and resumes when the database is back."""
    database = server.create_database("kirim")
    with Receiver(seed=22) as receiver:
        config = write_pg_config(tmp_path, database, receiver.url, lease=3)
        enqueue(config, 4)  # due now
        enqueue_later(config, 20, delay=6.0)  # due while the database is away
        receiver.hold()
        with workers(config, 1, "--concurrency", "8") as (w,):
            wait_until(lambda: receiver.in_flight == 4, 30)
            stopped = time.monotonic()
            server.stop("fast")
            wait_until(lambda: w.count("lease_renewal_failing") == 1, 10)
            # Past the pool's wait (10 s) for a claim that had started before, with
            # work due and four slots free: no claim is even tried.
            time.sleep(max(0.0, stopped + 12 - time.monotonic()))
            mark = len(w.names())
            time.sleep(3)
            assert "claim_failed" not in w.since(mark), w.log()
            assert "job_claimed" not in w.since(mark)
            assert receiver.delivered() == 4
            assert w.proc.poll() is None, w.log()
            receiver.release()  # the outcomes wait for the database
            server.start()
            wait_until(lambda: w.count("lease_renewal_restored") == 1, 20)
            wait_until(lambda: receiver.delivered() == 24, 30)
            wait_until(lambda: statuses_of(database) == {"sent"}, 20)
            w.proc.send_signal(signal.SIGTERM)
            assert w.wait(timeout=30) == 0, w.log()
        assert_each_once(receiver, database, 24)


async def test_idle_worker_outlives_an_outage_longer_than_the_pool_wait(
    server: PrivateServer,
) -> None:
    """An idle worker (burst or not) whose database is away for longer than its pool
    waits for a connection logs errors and goes on; it delivers once the database is
    back."""
    database = server.create_database("kirim")
    producer = PostgresStore(database)
    await producer.open()
    await producer.migrate()
    await producer.enqueue([numbered(0)], now=time.time())
    held = await producer.claim(worker_id="elsewhere", now=time.time(), lease=60, limit=1)
    assert len(held) == 1  # someone else's lease: the burst worker waits for it
    arrivals: asyncio.Queue[str] = asyncio.Queue()

    async def arrived(message: Message) -> None:
        await arrivals.put(message.event_id)

    provider = FlakyProvider(idempotent=False, on_request=arrived)
    stores = [PostgresStore(database, timeout=0.5) for _ in range(2)]
    tasks: list[asyncio.Task[object]] = []
    try:
        for store in stores:
            await store.open()
        settings = WorkerSettings(lease=3, poll_interval=0.1)
        channels = {"push": Channel(name="push", provider=provider)}
        idle, burst = (KirimWorker(store, channels, settings=settings) for store in stores)
        tasks = [asyncio.create_task(idle.run()), asyncio.create_task(burst.run(burst=True))]
        await asyncio.wait_for(idle.waiting.wait(), 10)
        await asyncio.to_thread(server.stop, "fast")
        await asyncio.sleep(2.5)  # five pool waits
        assert not any(t.done() for t in tasks)
        await asyncio.to_thread(server.start)
        await producer.close()  # its connections died with the server
        await producer.open()
        await producer.enqueue([numbered(1)], now=time.time())
        assert await asyncio.wait_for(arrivals.get(), 20) == "e1"
        c = held[0]
        lease = Lease(job_id=c.job.id, delivery_id=c.delivery.id, token=c.token)
        await producer.release([lease], now=time.time())
        await asyncio.wait_for(tasks[1], 20)  # the burst worker ends once all is done
        idle.stop()
        await asyncio.wait_for(tasks[0], 20)
        assert sorted(m.event_id for m in provider.requests) == ["e0", "e1"]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for store in [producer, *stores]:
            await store.close()


def test_private_server_helper_is_really_private(server: PrivateServer) -> None:
    """The fault tests' server is a cluster of its own, not the shared one."""
    with psycopg.connect(server.url()) as conn:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    assert row is not None
    assert str(row[0]).startswith(str(server.root))
