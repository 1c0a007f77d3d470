"""procrastinate's side of the comparison: defer N no-op jobs, then run them.

On a throw-away database of the given server (created, then dropped), with
procrastinate's own worker (``run_worker_async(wait=False)``: it stops once the
queue is empty) in 1 or more processes that start together, each with an async
no-op task, ``concurrency`` jobs at once and a connection pool large enough for
them. Needs ``pip install 'kirim[bench]'``; a dev-only dependency, never used by
the tests. Run alone: ``python bench/procrastinate_bench.py --database URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from kirim.devtools.bench import run_together, scratch

BATCH = 1000


def _app(url: str, concurrency: int) -> Any:
    import procrastinate

    pool = min(concurrency + 2, 20)
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=url, min_size=pool, max_size=pool)
    )

    @app.task(name="noop")
    async def noop(n: int) -> None:
        return None

    return app


async def _defer(url: str, n: int) -> float:
    app = _app(url, 1)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        task = app.tasks["noop"]
        started = time.perf_counter()
        for lo in range(0, n, BATCH):
            await task.batch_defer_async(*({"n": i} for i in range(lo, min(n, lo + BATCH))))
        return time.perf_counter() - started


def _worker(url: str, concurrency: int, ready: Any, go: Any, out: Any) -> None:
    async def main() -> tuple[float, float]:
        app = _app(url, concurrency)
        async with app.open_async():
            ready.release()
            await asyncio.get_running_loop().run_in_executor(None, go.wait)
            started = time.perf_counter()
            await app.run_worker_async(
                concurrency=concurrency, wait=False, install_signal_handlers=False
            )
            return started, time.perf_counter()

    out.put(asyncio.run(main()))


async def _done(url: str) -> int:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        )
        row = await cur.fetchone()
    return int(row[0]) if row else 0


def run(database: str, jobs: int, processes: int, concurrency: int) -> dict[str, Any]:
    """Defer then run ``jobs`` no-op jobs; the rates."""
    with tempfile.TemporaryDirectory() as tmp, scratch(database, Path(tmp)) as url:
        defer_s = asyncio.run(_defer(url, jobs))
        results = run_together(_worker, (url, concurrency), processes)
        run_s = max(r[1] for r in results) - min(r[0] for r in results)
        done = asyncio.run(_done(url))
    return {
        "system": "procrastinate",
        "jobs": jobs,
        "workers": processes,
        "concurrency": concurrency,
        "done": done,
        "defers_per_s": round(jobs / defer_s, 1),
        "jobs_per_s": round(done / run_s, 1),
        "run_seconds": round(run_s, 3),
    }


def best(database: str, jobs: int, processes: int, choices: tuple[int, ...]) -> dict[str, Any]:
    """procrastinate at its best ``concurrency`` among ``choices`` (each measured)."""
    tried = [run(database, jobs, processes, c) for c in choices]
    top = max(tried, key=lambda r: r["jobs_per_s"])
    top["tried"] = {r["concurrency"]: r["jobs_per_s"] for r in tried}
    return top


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 10, 50])
    args = parser.parse_args()
    result = best(args.database, args.jobs, args.workers, tuple(args.concurrency))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
