"""Real worker processes on one PostgreSQL database against a real loopback receiver."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_processes import enqueue, statuses, worker, write_config

from kirim.devtools.receiver import Receiver
from pg import fresh_database

pytestmark = pytest.mark.slow


def write_pg_config(tmp_path: Path, database: str, url: str, **options: float) -> Path:
    """``test_processes.write_config`` (a receiver that honours no key, ``assume_sent``)
    on the PostgreSQL ``database``."""
    config = write_config(tmp_path, url, **options)
    lines = config.read_text().splitlines()
    assert lines[0].startswith("database = ")
    config.write_text("\n".join([f'database = "{database}"', *lines[1:]]) + "\n")
    return config


def test_four_workers_deliver_5000_each_exactly_once(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Four worker processes on one PostgreSQL database deliver 5,000 notifications, each
    exactly once, within a minute."""
    database = fresh_database(request)
    with Receiver(seed=11) as receiver:
        config = write_pg_config(tmp_path, database, receiver.url)
        enqueue(config, 5000)
        started = time.monotonic()
        procs = [worker(config, "--burst", "--concurrency", "32") for _ in range(4)]
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err.decode()
        elapsed = time.monotonic() - started
        assert receiver.duplicates() == 0
        assert receiver.delivered() == 5000
    assert statuses(config) == {"sent": 5000}
    assert elapsed < 60
