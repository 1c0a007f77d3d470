"""``kirim demo``: the write-up's incident, replayed against kirim on SQLite.

A local receiver that honours nothing (so any duplicate would show) is sometimes
slow and sometimes accepts a request and then lets the call time out. Several
worker processes with a short lease deliver a few hundred notifications; in the
middle of their sends one worker is frozen (SIGSTOP) past its lease and another is
killed (SIGKILL). The table at the end counts what the receiver saw.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from kirim.config import load_config
from kirim.devtools.receiver import Behaviour, Receiver
from kirim.engine import Kirim, NotifyRequest
from kirim.model import DeliveryStatus, Doubt, JobStatus
from kirim.operations import EVERY

LEASE = 2.0
CONFIG = """\
database = "{database}"
[worker]
lease = {lease}
max_attempts = 8
poll_interval = 0.1
backoff_base = 0.05
backoff_max = 0.5
shutdown_grace = 2
[channels.push]
provider = "webhook"
url = "{url}"
timeout = 1.0
idempotent = false
on_unknown = "assume_sent"
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoResult:
    notifications: int
    delivered: int
    duplicate_requests: int
    in_doubt: int
    retries: int
    dead_lettered: int
    lost: int
    unfinished: int
    seconds: float
    killed: int
    frozen: int


def run_demo(
    console: Console, notifications: int = 300, workers: int = 3, seed: int | None = None
) -> int:
    """Run the demo; return 0 when nothing was duplicated and nothing lost."""
    if notifications < 1 or workers < 1:
        raise ValueError("notifications and workers must be at least 1")
    seed = random.randrange(1 << 30) if seed is None else seed
    behaviour = Behaviour(slow_rate=0.12, slow_s=(0.2, 0.7), hang_rate=0.05, hang_s=1.6)
    with (
        tempfile.TemporaryDirectory(prefix="kirim-demo-") as tmp,
        Receiver(behaviour, seed=seed) as receiver,
    ):
        folder = Path(tmp)
        config = folder / "kirim.toml"
        config.write_text(
            CONFIG.format(database=f"sqlite:///{folder / 'demo.db'}", lease=LEASE, url=receiver.url)
        )
        console.print(
            f"[bold]kirim demo[/] seed={seed}: {notifications} notifications, {workers} "
            f"worker processes, lease {LEASE:g}s, a receiver on {receiver.url} that "
            "honours nothing, is slow 12% of the time and lets 5% of calls time out "
            "after accepting them."
        )
        asyncio.run(_enqueue(config, notifications))
        started = time.monotonic()
        result = _run_workers(console, folder, config, receiver, notifications, workers)
        report = asyncio.run(_report(config, receiver, notifications, started, result))
    _print(console, report)
    ok = report.duplicate_requests == 0 and report.lost == 0 and report.unfinished == 0
    console.print(
        "[bold green]0 duplicates, 0 lost.[/]" if ok else "[bold red]the demo found a problem[/]"
    )
    return 0 if ok else 1


async def _enqueue(config: Path, n: int) -> None:
    app = Kirim(load_config(config))
    await app.open(migrate=True)
    try:
        requests = [
            NotifyRequest(
                event_id=f"order-{i}",
                recipient=f"user-{i % 97}",
                channel="push",
                payload={"title": "Your order shipped", "order": i},
            )
            for i in range(n)
        ]
        await app.notify_many(requests)
    finally:
        await app.close()


@dataclass(frozen=True, slots=True, kw_only=True)
class _Chaos:
    killed: int
    frozen: int


def _run_workers(
    console: Console, folder: Path, config: Path, receiver: Receiver, total: int, workers: int
) -> _Chaos:
    procs = []
    logs = []
    for i in range(workers):
        log = (folder / f"worker-{i + 1}.log").open("w")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "kirim",
                    "--config",
                    str(config),
                    "worker",
                    "--burst",
                    "--concurrency",
                    "8",
                    "--worker-id",
                    f"worker-{i + 1}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        )
    killed = frozen = 0
    chaos_done = False
    thaw_at: float | None = None
    deadline = time.monotonic() + 90
    try:
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task("delivering", total=total)
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                done = len(receiver.requests)
                progress.update(bar, completed=done)
                if not chaos_done and done >= total // 4:
                    chaos_done = True
                    killed, frozen = _strike(console, receiver, procs)
                    thaw_at = time.monotonic() + 2 * LEASE + 0.5
                if thaw_at is not None and time.monotonic() >= thaw_at:
                    os.kill(procs[0].pid, signal.SIGCONT)
                    console.print("  [yellow]worker-1 thawed[/] after its lease expired")
                    thaw_at = None
                time.sleep(0.1)
    finally:
        if thaw_at is not None:
            os.kill(procs[0].pid, signal.SIGCONT)
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for log in logs:
            log.close()
    return _Chaos(killed=killed, frozen=frozen)


def _strike(
    console: Console, receiver: Receiver, procs: list[subprocess.Popen[bytes]]
) -> tuple[int, int]:
    """Hold the receiver so every worker has requests in flight, then freeze and kill."""
    receiver.hold()
    waited = time.monotonic() + 2.0
    while receiver.in_flight < 2 * len(procs) and time.monotonic() < waited:
        time.sleep(0.01)
    killed = 0
    if len(procs) > 1 and procs[1].poll() is None:
        os.kill(procs[1].pid, signal.SIGKILL)
        killed = 1
        console.print(
            f"  [red]worker-2 killed[/] (SIGKILL) with {receiver.in_flight} "
            "requests in flight at the receiver"
        )
    os.kill(procs[0].pid, signal.SIGSTOP)
    console.print(
        f"  [yellow]worker-1 frozen[/] (SIGSTOP) for {2 * LEASE + 0.5:g}s, "
        f"longer than its {LEASE:g}s lease"
    )
    receiver.release()
    return killed, 1


async def _report(
    config: Path, receiver: Receiver, total: int, started: float, chaos: _Chaos
) -> DemoResult:
    app = Kirim(load_config(config))
    await app.open()
    try:
        in_doubt = retries = dead = lost = unfinished = 0
        cursor: int | None = None
        while True:  # every delivery with its job, a page at a time
            page = await app.records(EVERY, cursor=cursor, limit=500)
            for record in page.records:
                d, job = record.delivery, record.job
                if job is not None:
                    retries += max(0, job.attempts - 1)
                    dead += job.status is JobStatus.DEAD
                doubtful = d.status is DeliveryStatus.IN_DOUBT or d.doubt is Doubt.ASSUMED_SENT
                in_doubt += doubtful
                if d.status in (DeliveryStatus.PENDING, DeliveryStatus.PROCESSING):
                    unfinished += 1
                elif (
                    receiver.requests[d.idempotency_key] == 0
                    and not doubtful
                    and (d.status is not DeliveryStatus.FAILED)
                ):
                    lost += 1
            if (cursor := page.next_cursor) is None:
                break
    finally:
        await app.close()
    return DemoResult(
        notifications=total,
        delivered=receiver.delivered(),
        duplicate_requests=receiver.duplicates(),
        in_doubt=in_doubt,
        retries=retries,
        dead_lettered=dead,
        lost=lost,
        unfinished=unfinished,
        seconds=time.monotonic() - started,
        killed=chaos.killed,
        frozen=chaos.frozen,
    )


def _print(console: Console, r: DemoResult) -> None:
    table = Table(title=f"kirim demo: {r.seconds:.1f}s")
    table.add_column("")
    table.add_column("count", justify="right")
    rows = [
        ("notifications", r.notifications),
        ("delivered (the receiver saw the key)", r.delivered),
        ("duplicate requests seen by the receiver", r.duplicate_requests),
        ("in doubt, reported (assumed sent or held)", r.in_doubt),
        ("retries", r.retries),
        ("dead-lettered", r.dead_lettered),
        ("lost (neither delivered nor reported)", r.lost + r.unfinished),
        ("workers killed / frozen", f"{r.killed} / {r.frozen}"),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)
