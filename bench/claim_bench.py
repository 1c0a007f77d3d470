"""The claim alone: CPU and wall time per claimed delivery, no worker and no send.

Enqueues N notifications (as ``kirim bench`` does), then claims them with the store,
``--batch`` at a time, until none is due, and prints the process's CPU and the wall
time per claimed delivery. The claimed deliveries are left processing (nothing is
sent). Prints; asserts nothing.

    .venv/bin/python bench/claim_bench.py --database postgresql://postgres@127.0.0.1/postgres
    .venv/bin/python bench/claim_bench.py              # a temporary SQLite file
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from kirim.devtools.bench import _app, _enqueue, scratch
from kirim.observe.logging import configure


async def _claim_all(url: str, batch: int) -> tuple[int, float, float]:
    """Claim every due job, ``batch`` at a time: (claimed, wall s, CPU s)."""
    app = _app(url)
    await app.open()
    try:
        claimed, cpu, wall = 0, time.process_time(), time.perf_counter()
        while got := await app.store.claim(
            worker_id="bench", now=time.time(), lease=30.0, limit=batch
        ):
            claimed += len(got)
        return claimed, time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", help="postgresql:// server (a throw-away database)")
    parser.add_argument("--notifications", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    configure(level="warning")
    with (
        tempfile.TemporaryDirectory(prefix="kirim-claim-") as tmp,
        scratch(args.database, Path(tmp)) as url,
    ):
        asyncio.run(_enqueue(url, args.notifications, 0))
        claimed, wall, cpu = asyncio.run(_claim_all(url, args.batch))
    print(
        f"{claimed:,} claimed {args.batch} at a time: CPU {cpu / claimed * 1e6:.1f} us, "
        f"wall {wall / claimed * 1e6:.1f} us per claimed delivery"
    )


if __name__ == "__main__":
    main()
