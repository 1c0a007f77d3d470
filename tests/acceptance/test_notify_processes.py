"""The notification layer across real processes on each backend: events from two
hosts into one digest while a third seals it, and a throttle two hosts share."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kirim.model import DeliveryStatus
from kirim.store import open_store
from kirim.store.digests import digest_key
from kirim.store.sqlite.driver import sqlite_path

pytestmark = pytest.mark.slow

HOST = Path(__file__).with_name("notify_host.py")
START, WINDOW, STREAM, LIMIT, HOUR = 1_800_000_000.0, 600.0, "liked|u1|email|u1", 5, 3600.0


class Host:
    """One process of ``notify_host.py``, started and waiting for its go."""

    def __init__(self, url: str, role: str, first: int, last: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HOST), url, role, str(first), str(last)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.expect("ready")

    def expect(self, line: str) -> None:
        assert self.proc.stdout is not None
        got = self.proc.stdout.readline().strip()
        if got != line:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=30)
            raise AssertionError(f"expected {line!r}, got {got!r}: {err}")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        """Wait for its ``done`` (past any progress lines) and its exit."""
        assert self.proc.stdout is not None
        while (line := self.proc.stdout.readline().strip()) == "half":
            pass
        _, err = self.proc.communicate(timeout=60)
        assert (line, self.proc.returncode) == ("done", 0), err

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=30)


@pytest.fixture
def hosts() -> Any:
    """Start hosts; whatever happens, none outlives the test."""
    started: list[Host] = []

    def start(url: str, role: str, first: int, last: int) -> Host:
        host = Host(url, role, first, last)
        started.append(host)
        return host

    yield start
    for host in started:
        host.stop()


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows straight from the ledger (``?`` placeholders not needed: no parameters)."""
    if url.startswith("sqlite:"):
        with sqlite3.connect(sqlite_path(url)[0]) as conn:
            return conn.execute(sql).fetchall()
    with psycopg.connect(url) as pg:
        return pg.execute(sql).fetchall()  # type: ignore[arg-type]


def events_of(url: str, key: str) -> list[str]:
    return [
        r[0]
        for r in query(
            url, f"SELECT event_id FROM kirim_digest_events WHERE digest_key = '{key}' ORDER BY id"
        )
    ]


def test_two_hosts_fill_one_digest_while_a_third_seals_it(database_url: str, hosts: Any) -> None:
    """Hosts A and B send events e0..e59 (e20..e39 from both) into one window while C
    claims and seals its digest: every event is in exactly one digest (the sealed one,
    or the next window's), each once, and the sealed payload holds all of its own."""
    a = hosts(database_url, "digest", 0, 40)
    b = hosts(database_url, "digest", 20, 60)
    c = hosts(database_url, "seal", 0, 0)
    a.go()
    b.go()
    a.expect("half")
    c.go()
    for host in (a, b, c):
        host.finish()

    async def digest() -> Any:
        store = open_store(database_url)
        await store.open()
        try:
            return await store.get_delivery(digest_key(STREAM, START), by="key")
        finally:
            await store.close()

    first = asyncio.run(digest())
    assert first is not None
    assert first.status is DeliveryStatus.SENT
    sealed = first.payload["events"]
    assert len(sealed) == len(set(sealed)) >= 21  # A's first half at least
    assert events_of(database_url, digest_key(STREAM, START)) == sealed
    rest = events_of(database_url, digest_key(STREAM, START + WINDOW))
    assert sorted(sealed + rest) == sorted(f"e{i}" for i in range(60))
    per_event = Counter(
        r[0] for r in query(database_url, "SELECT event_id FROM kirim_digest_events")
    )
    assert set(per_event.values()) == {1}
    deliveries = query(database_url, "SELECT count(*) FROM kirim_deliveries")
    assert deliveries == [(1 if not rest else 2,)]


@pytest.mark.parametrize("over", ["suppress", "defer"])
def test_two_hosts_share_one_throttle_exactly(database_url: str, over: str, hosts: Any) -> None:
    """Two hosts enqueue 30 deliveries each for one recipient under a throttle of 5 an
    hour: exactly 5 go out in the hour, the rest suppressed, or deferred 5 per later
    hour."""
    both = [hosts(database_url, over, 0, 30), hosts(database_url, over, 30, 60)]
    for host in both:
        host.go()
    for host in both:
        host.finish()
    statuses = Counter(r[0] for r in query(database_url, "SELECT status FROM kirim_deliveries"))
    windows = Counter(
        r[0] for r in query(database_url, "SELECT run_at FROM kirim_jobs WHERE status = 'queued'")
    )
    if over == "suppress":
        assert statuses == {"pending": LIMIT, "suppressed": 60 - LIMIT}
        assert list(windows.values()) == [LIMIT]
    else:
        assert statuses == {"pending": 60}
        # the first hour's due at once (the hosts stamp START + 1), the rest at their hour
        assert windows == {max(START + 1, START + k * HOUR): LIMIT for k in range(60 // LIMIT)}
    counters = query(database_url, "SELECT count FROM kirim_throttle")
    assert [r[0] for r in counters] == [LIMIT] * len(counters)
