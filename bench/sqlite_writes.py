"""What each row of the transitions' write-backs costs on SQLite (``write_*``, µs/row).

Enqueues N notifications (as ``kirim bench`` does), drains them with one worker in
this process, and times every statement the SQLite driver runs for the claim, intent
and finish write-backs (``kirim.store.sqlite.driver.execute``, wrapped: binding and
SQLite's own work, on the driver's thread), then prints the time per row written of
each, the median of ``--rounds`` fresh runs. The time is the CPU time of the driver's
thread (``time.thread_time``): what other processes on the machine do barely moves
it. Prints; asserts nothing.

    .venv/bin/python bench/sqlite_writes.py --notifications 5000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from kirim.devtools.bench import _app, _enqueue, settings_for
from kirim.observe.logging import configure
from kirim.store.sqlite import driver

#: the statements timed: the write-backs of claim and finish, and the intents
TIMED = ("write_deliveries", "write_jobs", "write_attempts", "insert_intents")
#: told apart by the status the rows are written with (a claim's, or a finish's)
_BY_STATUS = ("write_deliveries", "write_jobs")
#: the lines printed
SHOWN = (
    "write_deliveries (claim)",
    "write_jobs (claim)",
    "insert_intents",
    "write_attempts",
    "write_deliveries (finish)",
    "write_jobs (finish)",
)


def _timed(
    spent: dict[str, float], rows: dict[str, int]
) -> Any:  # the wrapped ``execute``, same signature
    real = driver.execute

    def execute(conn: Any, step: Any) -> Any:
        if step.name not in TIMED:
            return real(conn, step)
        items = step.args.get("items") or ()
        name = step.name
        if name in _BY_STATUS and items:
            name += " (claim)" if items[0]["status"] in ("processing", "running") else " (finish)"
        started = time.thread_time()
        result = real(conn, step)
        spent[name] += time.thread_time() - started
        rows[name] += len(items)
        return result

    return execute


async def _drain(url: str) -> None:
    app = _app(url)
    await app.open()
    try:
        await app.worker(settings=settings_for(url)).run(burst=True)
    finally:
        await app.close()


def one_round(n: int) -> dict[str, float]:
    """µs per row of each timed statement, in one fresh database of ``n`` deliveries."""
    spent: dict[str, float] = defaultdict(float)
    rows: dict[str, int] = defaultdict(int)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'writes.db'}"
        asyncio.run(_enqueue(url, n, 0))
        real = driver.execute
        driver.execute = _timed(spent, rows)
        try:
            asyncio.run(_drain(url))
        finally:
            driver.execute = real
    return {name: 1e6 * spent[name] / rows[name] for name in rows if rows[name]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notifications", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    configure(level="warning")
    found: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.rounds):
        for name, us in one_round(args.notifications).items():
            found[name].append(us)
    for name in SHOWN:
        if found[name]:
            shown = " ".join(f"{us:.1f}" for us in found[name])
            print(f"{name:26} {statistics.median(found[name]):6.1f} µs/row  (rounds: {shown})")


if __name__ == "__main__":
    main()
