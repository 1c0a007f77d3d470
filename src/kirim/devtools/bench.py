"""``kirim bench``: enqueues and deliveries per second on your own hardware.

Deliveries go to a zero-latency in-process provider, through the full ledger
(delivery, job, attempt written ahead, outcome committed), in worker processes
that start together once every one of them is ready. Progress goes to stderr while
it runs (``say``); the result is what ``run_bench`` returns, with the durability the
run had (SQLite's journal mode and ``synchronous``, or the PostgreSQL server's
``synchronous_commit`` and ``fsync``): rates mean little without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import queue
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from kirim.channels import Channel
from kirim.config import Config
from kirim.devtools import pgfigures
from kirim.engine import Kirim, NotifyRequest
from kirim.errors import ConfigError, KirimError
from kirim.observe.logging import FORMATS, LEVELS, configure
from kirim.providers.null import NullProvider
from kirim.worker import WorkerSettings

BATCH = 1000
SETTINGS = WorkerSettings(lease=30, concurrency=256, batch_size=256, poll_interval=0.05)
# PostgreSQL: two claim batches in flight per worker, so that the next batch is claimed
# while the last one's intents and outcomes are written (one worker: +36%).
PG_SETTINGS = WorkerSettings(lease=30, concurrency=512, batch_size=256, poll_interval=0.05)


SYNC_CHOICES = ("full", "normal")  # kirim bench --sync: SQLite's synchronous setting


def is_postgres(database: str | None) -> bool:
    return database is not None and database.startswith(("postgresql:", "postgres:"))


def settings_for(database: str) -> WorkerSettings:
    return PG_SETTINGS if is_postgres(database) else SETTINGS


def with_sync(url: str, sync: str) -> str:
    """The SQLite URL with ``?synchronous=sync`` (in place of one it had). Split by hand:
    ``urlunsplit`` would turn ``sqlite:////abs.db`` into ``sqlite://abs.db``."""
    base, _, query = url.partition("?")
    kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "synchronous"]
    return f"{base}?{urlencode([*kept, ('synchronous', sync)])}"


def durability(url: str) -> str:
    """What a commit survives, as the run had it: ``WAL, synchronous=full`` (the SQLite
    file's journal mode, read from the file, and the URL's ``synchronous``, the store's
    default ``full`` without one), or the PostgreSQL server's ``synchronous_commit``
    and ``fsync`` as this URL's connections see them."""
    if is_postgres(url):
        import psycopg

        from kirim.store.postgres import postgres_conninfo

        conninfo, _ = postgres_conninfo(url)
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
            shown = []
            for name in ("synchronous_commit", "fsync"):
                row = conn.execute(f"SHOW {name}").fetchone()
                shown.append(f"{name}={row[0] if row else '?'}")
        return ", ".join(shown)
    base, _, query = url.partition("?")
    sync = dict(parse_qsl(query)).get("synchronous", "full").lower()
    try:  # sqlite:///rel.db → rel.db, sqlite:////abs.db → /abs.db
        file = sqlite3.connect(f"file:{quote(base.removeprefix('sqlite:///'))}?mode=ro", uri=True)
        try:
            row = file.execute("PRAGMA journal_mode").fetchone()
        finally:
            file.close()
        journal = str(row[0]).upper() if row else "?"
    except sqlite3.Error:
        journal = "?"
    return f"{journal}, synchronous={sync}"


def _app(database: str) -> Kirim:
    channel = Channel(name="bench", provider=NullProvider())
    return Kirim(Config(database=database), channels={"bench": channel})


async def _enqueue(database: str, n: int, offset: int) -> float:
    app = _app(database)
    await app.open(migrate=True)
    try:
        started = time.perf_counter()
        for lo in range(0, n, BATCH):
            await app.notify_many(
                [
                    NotifyRequest(
                        event_id=f"e{offset + i}",
                        recipient="u",
                        channel="bench",
                        payload={"n": offset + i},
                    )
                    for i in range(lo, min(n, lo + BATCH))
                ]
            )
        return time.perf_counter() - started
    finally:
        await app.close()


def _worker(
    database: str, metrics: bool, log: tuple[str, str], ready: Any, go: Any, out: Any
) -> None:
    """One worker process of the bench. ``log``: its level and format; the lines go to
    the null device, rendered and written all the same, so that their cost counts."""
    level, fmt = log

    async def main() -> tuple[float, float, int, float]:
        app = _app(database)
        await app.open()
        try:
            if metrics:
                from kirim.observe.metrics import Metrics

                app.metrics = Metrics()
            worker = app.worker(settings=settings_for(database))
            ready.release()
            await asyncio.get_running_loop().run_in_executor(None, go.wait)
            started, cpu = time.perf_counter(), time.process_time()
            stats = await worker.run(burst=True)
            return started, time.perf_counter(), stats.sent, time.process_time() - cpu
        finally:
            await app.close()

    with open(os.devnull, "w") as sink:
        configure(level=level, fmt=fmt, stream=sink)
        out.put(asyncio.run(main()))


def say(line: str) -> None:
    """One line of progress on stderr (a closed stderr does not stop the run)."""
    with contextlib.suppress(OSError, ValueError):
        print(f"bench: {line}", file=sys.stderr, flush=True)


def run_together(
    target: Callable[..., None],
    args: tuple[Any, ...],
    processes: int,
    tick: Callable[[], None] | None = None,
) -> list[Any]:
    """Run ``target(*args, ready, go, out)`` in ``processes`` spawned processes that start
    their work together, once every one has released ``ready``; return what each put on
    ``out`` (for the benchmarks: its start and end times first). ``tick`` is called
    every two seconds or so while they work."""
    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, ready, go, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    go.set()
    results: list[Any] = []
    deadline = time.monotonic() + 600
    while len(results) < len(procs):
        try:
            results.append(out.get(timeout=max(0.01, min(2.0, deadline - time.monotonic()))))
        except queue.Empty:
            if time.monotonic() >= deadline:
                raise
            if tick is not None:
                tick()
    for p in procs:
        p.join()
    return results


def _deliver(
    database: str,
    workers: int,
    metrics: bool = False,
    total: int = 0,
    log: tuple[str, str] = ("warning", "logfmt"),
) -> tuple[float, int, float]:
    """Deliver with ``workers`` processes: the seconds from the first start to the last
    end, the deliveries sent, and the CPU seconds (user + system, every thread) the
    worker processes spent in ``worker.run``."""
    started = time.monotonic()

    def tick() -> None:
        sent = asyncio.run(_sent(database))
        say(f"{sent:,}/{total:,} delivered, {time.monotonic() - started:.1f}s")

    results = run_together(_worker, (database, metrics, log), workers, tick)
    started = min(r[0] for r in results)
    ended = max(r[1] for r in results)
    return ended - started, sum(r[2] for r in results), sum(r[3] for r in results)


async def _sent(database: str) -> int:
    """Deliveries sent so far (for the progress lines; -1 if the store does not answer)."""
    app = _app(database)
    try:
        await app.store.open()
        return (await app.store.counts())["deliveries"].get("sent", 0)
    except KirimError:
        return -1
    finally:
        await app.close()


def scratch(database: str | None, folder: Path) -> contextlib.AbstractContextManager[str]:
    """Where to measure: a throw-away PostgreSQL database on the server of a
    ``postgresql://`` URL (created, then dropped), a temporary SQLite file for None, or
    the SQLite file given."""
    if is_postgres(database):
        from kirim.simulate.harness import scratch_database

        return scratch_database(database, folder)
    return contextlib.nullcontext(database or f"sqlite:///{folder / 'bench.db'}")


def run_bench(
    database: str | None,
    notifications: int,
    workers: int,
    metrics: bool = False,
    sync: str | None = None,
    worker_log: tuple[str, str] = ("warning", "logfmt"),
) -> dict[str, Any]:
    """Enqueue then deliver ``notifications``; return the rates (``metrics``: workers
    record Prometheus metrics, to measure what they cost; ``sync``: SQLite's
    ``synchronous``, ``full`` or ``normal``, set on the URL; None keeps the URL's, else
    ``full``; ``worker_log``: the workers' log level and format, their lines written to
    the null device, to measure what they cost). ``sync`` with a PostgreSQL URL is a
    ``ConfigError``: there durability is the server's, and the result reports it."""
    level, fmt = worker_log
    if level not in LEVELS or fmt not in FORMATS:
        raise ConfigError(
            f"worker_log must be a level of {list(LEVELS)} and a format, not {worker_log!r}"
        )
    if sync is not None:
        if sync not in SYNC_CHOICES:
            raise ConfigError(f"sync must be one of {list(SYNC_CHOICES)}, not {sync!r}")
        if is_postgres(database):
            raise ConfigError(
                "--sync is SQLite's synchronous setting; on PostgreSQL durability is the "
                "server's (synchronous_commit, fsync), which the result reports"
            )
    configure(level="warning")
    with (
        tempfile.TemporaryDirectory(prefix="kirim-bench-") as tmp,
        scratch(database, Path(tmp)) as where_url,
    ):
        given = where_url == database  # an existing SQLite file: fresh event ids
        url = with_sync(where_url, sync) if sync and where_url.startswith("sqlite:") else where_url
        offset = int(time.time() * 1000) % 10**9 * 1000 if given else 0
        say(f"enqueueing {notifications:,} notifications")
        enqueue_s = asyncio.run(_enqueue(url, notifications, offset))
        say(f"enqueued in {enqueue_s:.2f}s; delivering with {workers} worker processes")
        before = pgfigures.snapshot(url) if is_postgres(url) else None
        deliver_s, sent, cpu_s = _deliver(url, workers, metrics, notifications, worker_log)
        say(f"{sent:,} delivered in {deliver_s:.2f}s")
        server = {} if before is None else pgfigures.figures(before, pgfigures.snapshot(url), sent)
        durable = durability(url)
    where = "sqlite (temporary file)" if database is None else url.split("@")[-1]
    if database is not None and not given:
        where += " (throw-away database, dropped)"
    return {
        "database": where,
        "durability": durable,
        "notifications": notifications,
        "workers": workers,
        "concurrency": settings_for(url).concurrency,
        "batch_size": settings_for(url).batch_size,
        "metrics": metrics,
        "worker_log_level": level,
        "delivered": sent,
        "enqueues_per_s": round(notifications / enqueue_s, 1),
        "deliveries_per_s": round(sent / deliver_s, 1) if deliver_s > 0 else None,
        "enqueue_seconds": round(enqueue_s, 3),
        "delivery_seconds": round(deliver_s, 3),
        "worker_cpu_us_per_delivery": round(cpu_s / sent * 1e6, 1) if sent else None,
        **server,
    }
