"""``kirim demo``: the write-up's incident, replayed against kirim on SQLite.

A local receiver that honours nothing (so any duplicate would show) is sometimes
slow and sometimes accepts a request and then lets the call time out. Several
worker processes with a short lease deliver a few hundred notifications; in the
middle of their sends one worker is frozen (SIGSTOP) past its lease and another is
killed (SIGKILL): the workers are ``kirim simulate``'s ``Fleet``. The table at the
end counts what the receiver saw, each notification judged as ``kirim.chaos`` does
(the same verdicts as ``kirim simulate`` and ``kirim explore``).
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from kirim.chaos import report_of, tally
from kirim.config import load_config
from kirim.devtools.receiver import Behaviour, Receiver
from kirim.engine import Kirim, NotifyRequest
from kirim.operations import EVERY
from kirim.simulate.fleet import Fleet
from kirim.simulate.skew import Offsets

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
    """The workers as simulate's ``Fleet``; a quarter of the way, worker-2 is killed and
    worker-1 frozen past its lease (``_strike``)."""

    def argv(worker_id: str, offset: float) -> list[str]:
        return [
            *(sys.executable, "-m", "kirim", "--config", str(config), "worker", "--burst"),
            *("--concurrency", "8", "--worker-id", worker_id),
        ]

    fleet = Fleet(argv, folder, Offsets(0.0, 0))
    killed = frozen = 0
    chaos_done = False
    deadline = time.monotonic() + 90
    try:
        for _ in range(workers):
            fleet.start()
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task("delivering", total=total)
            while fleet.busy() and time.monotonic() < deadline:
                done = len(receiver.requests)
                progress.update(bar, completed=done)
                if not chaos_done and done >= total // 4:
                    chaos_done = True
                    killed, frozen = _strike(console, receiver, fleet)
                stopped = set(fleet.thaw_at)
                fleet.tick(time.monotonic())
                for worker_id in sorted(stopped - set(fleet.thaw_at)):
                    console.print(f"  [yellow]{worker_id} thawed[/] after its lease expired")
                time.sleep(0.1)
    finally:
        fleet.close()
    for crash in fleet.crashes:
        console.print(f"  [red]worker crashed:[/] {crash}")
    return _Chaos(killed=killed, frozen=frozen)


def _strike(console: Console, receiver: Receiver, fleet: Fleet) -> tuple[int, int]:
    """Hold the receiver so every worker has requests in flight, then freeze and kill."""
    receiver.hold()
    waited = time.monotonic() + 2.0
    while receiver.in_flight < 2 * len(fleet.procs) and time.monotonic() < waited:
        time.sleep(0.01)
    killed = frozen = 0
    running = fleet.running()
    if len(fleet.procs) > 1 and "worker-2" in running:
        fleet.kill("worker-2")
        killed = 1
        console.print(
            f"  [red]worker-2 killed[/] (SIGKILL) with {receiver.in_flight} "
            "requests in flight at the receiver"
        )
    if "worker-1" in running:
        fleet.stall("worker-1", time.monotonic() + 2 * LEASE + 0.5)
        frozen = 1
        console.print(
            f"  [yellow]worker-1 frozen[/] (SIGSTOP) for {2 * LEASE + 0.5:g}s, "
            f"longer than its {LEASE:g}s lease"
        )
    receiver.release()
    return killed, frozen


async def _report(
    config: Path, receiver: Receiver, total: int, started: float, chaos: _Chaos
) -> DemoResult:
    """What the receiver saw and the ledger says, judged as ``kirim.chaos`` does."""
    app = Kirim(load_config(config))
    await app.open()
    reports = []
    try:
        cursor: int | None = None
        while True:  # every delivery with its job, a page at a time
            page = await app.records(EVERY, cursor=cursor, limit=500)
            reports += [report_of(r.delivery, r.job, r.attempts) for r in page.records]
            if (cursor := page.next_cursor) is None:
                break
    finally:
        await app.close()
    found = tally(reports, receiver.requests, receiver.copies())
    return DemoResult(
        notifications=total,
        delivered=receiver.delivered(),
        duplicate_requests=receiver.duplicates(),
        in_doubt=found.in_doubt,
        retries=found.retries,
        dead_lettered=found.dead_lettered,
        lost=found.lost,
        unfinished=found.unfinished,
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
        ("lost (neither delivered nor reported)", r.lost),
        ("unfinished (still pending or processing)", r.unfinished),
        ("workers killed / frozen", f"{r.killed} / {r.frozen}"),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)
