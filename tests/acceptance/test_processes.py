"""Real worker processes on one SQLite file against a real loopback receiver."""

from __future__ import annotations

import asyncio
import io
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from kirim.config import load_config
from kirim.devtools.demo import run_demo
from kirim.devtools.receiver import Receiver
from kirim.engine import Kirim, NotifyRequest

pytestmark = pytest.mark.slow


def wait_until(predicate: Callable[[], bool], within: float = 30.0) -> None:
    """Poll a condition on another process; fail if it never holds."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def write_config(tmp_path: Path, url: str, *, lease: float = 5, grace: float = 10) -> Path:
    config = tmp_path / "kirim.toml"
    config.write_text(
        f'database = "sqlite:///{tmp_path / "kirim.db"}"\n'
        f"[worker]\nlease = {lease}\npoll_interval = 0.05\nbackoff_base = 0.05\n"
        f"shutdown_grace = {grace}\n"
        f'[channels.push]\nprovider = "webhook"\nurl = "{url}"\ntimeout = 5\n'
        'idempotent = false\non_unknown = "assume_sent"\n'
    )
    return config


def enqueue(config: Path, n: int) -> None:
    async def main() -> None:
        app = Kirim(load_config(config))
        await app.open(migrate=True)
        try:
            await app.notify_many(
                [
                    NotifyRequest(
                        event_id=f"e{i}", recipient=f"u{i}", channel="push", payload={"i": i}
                    )
                    for i in range(n)
                ]
            )
        finally:
            await app.close()

    asyncio.run(main())


def statuses(config: Path) -> dict[str, int]:
    async def main() -> dict[str, int]:
        app = Kirim(load_config(config))
        await app.open()
        try:
            return (await app.store.counts())["deliveries"]
        finally:
            await app.close()

    return asyncio.run(main())


def worker(config: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kirim",
            "--config",
            str(config),
            "--log-level",
            "warning",
            "worker",
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def test_worker_processes_deliver_each_exactly_once(tmp_path: Path) -> None:
    """Three worker processes on one SQLite file deliver 2,000 notifications once each."""
    with Receiver(seed=1) as receiver:
        config = write_config(tmp_path, receiver.url)
        enqueue(config, 2000)
        procs = [worker(config, "--burst", "--concurrency", "16") for _ in range(3)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()
        assert receiver.delivered() == 2000
        assert receiver.duplicates() == 0
    assert statuses(config) == {"sent": 2000}


def test_sigterm_finishes_work_in_flight(tmp_path: Path) -> None:
    """SIGTERM stops claiming and lets the requests in flight finish and commit."""
    with Receiver(seed=2) as receiver:
        config = write_config(tmp_path, receiver.url)
        enqueue(config, 40)
        receiver.hold()
        proc = worker(config, "--concurrency", "8")
        wait_until(lambda: receiver.in_flight == 8)
        proc.send_signal(signal.SIGTERM)
        receiver.release()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err.decode()
        assert receiver.delivered() == 8
    assert statuses(config) == {"sent": 8, "pending": 32}


def test_sigterm_past_the_grace_releases_work_for_others(tmp_path: Path) -> None:
    """Work still stuck after the grace period is released and finished by another worker
    without a duplicate."""
    with Receiver(seed=3) as receiver:
        config = write_config(tmp_path, receiver.url, grace=0.2)
        enqueue(config, 4)
        receiver.hold()
        proc = worker(config, "--concurrency", "4")
        wait_until(lambda: receiver.in_flight == 4)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err.decode()
        assert b"leases_released" in err
        assert statuses(config) == {"processing": 4}  # claims revoked, jobs back in the queue
        receiver.release()
        second = worker(config, "--burst")
        _, err = second.communicate(timeout=30)
        assert second.returncode == 0, err.decode()
        assert receiver.duplicates() == 0
        assert receiver.delivered() == 4
    assert statuses(config) == {"sent": 4}


def test_demo_shows_no_duplicate_and_nothing_lost() -> None:
    """`kirim demo` freezes and kills workers mid-send and still reports 0 and 0."""
    out = io.StringIO()
    code = run_demo(Console(file=out, width=100), notifications=120, workers=3, seed=5)
    text = out.getvalue()
    assert code == 0, text
    assert "0 duplicates, 0 lost." in text
    assert "worker-2 killed" in text
    assert "worker-1 frozen" in text
