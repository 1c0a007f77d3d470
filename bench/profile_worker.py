"""Where a delivery's time goes in ``kirim bench``'s worker: one worker, profiled.

Enqueues N notifications (as ``kirim bench`` does), then runs one worker in this
process under cProfile until the queue is empty, and prints the functions by own time
and by cumulative time, and the worker's CPU per delivery. Prints; asserts nothing.

    .venv/bin/python bench/profile_worker.py --notifications 10000
    .venv/bin/python bench/profile_worker.py --database postgresql://postgres@127.0.0.1/postgres
    .venv/bin/python bench/profile_worker.py --no-profile   # CPU per delivery, no profiler
    .venv/bin/python bench/profile_worker.py --library-logging  # structlog left unconfigured

Before the two listings it prints the own time by area (kirim's worker, kirim's store,
psycopg, asyncio and the rest of the standard library, C builtins), waits left out
(the event loop's ``poll``, the SQLite thread's queue): the shares to read first.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import tempfile
import time
from collections import Counter
from pathlib import Path

from kirim.devtools.bench import _app, _enqueue, scratch, settings_for
from kirim.observe.logging import configure


async def _drain(
    url: str, profile: cProfile.Profile | None, in_thread: cProfile.Profile | None
) -> tuple[int, float, float]:
    """Run one worker until the queue is empty, under ``profile`` (the event loop's
    thread) and ``in_thread`` (SQLite's: its driver runs every transaction on a thread
    of its own, which a profiler of the main thread does not see)."""
    app = _app(url)
    await app.open()
    executor = getattr(getattr(app.store, "driver", None), "_executor", None)
    loop = asyncio.get_running_loop()
    try:
        worker = app.worker(settings=settings_for(url))
        started, cpu = time.perf_counter(), time.process_time()
        if profile is not None and in_thread is not None and executor is not None:
            await loop.run_in_executor(executor, in_thread.enable)
        if profile is not None:
            profile.enable()
        stats = await worker.run(burst=True)
        if profile is not None:
            profile.disable()
        if profile is not None and in_thread is not None and executor is not None:
            await loop.run_in_executor(executor, in_thread.disable)
        return stats.sent, time.perf_counter() - started, time.process_time() - cpu
    finally:
        await app.close()


#: functions whose own time is waiting, not work (left out of the areas)
WAITS = ("poll' of 'select.epoll", "get' of '_queue.SimpleQueue", "acquire' of '_thread.lock")


def area(filename: str) -> str:
    """The area a profiled function belongs to: a package of kirim (``kirim/worker``),
    a third-party distribution, ``stdlib:<module>`` or ``C builtins``."""
    if filename == "~":
        return "C builtins"
    if "site-packages/" in filename:
        return filename.split("site-packages/")[-1].split("/")[0]
    if "/src/kirim/" in filename:
        parts = filename.split("/src/")[-1].split("/")
        return "/".join(parts[:2]) if len(parts) > 2 else parts[0]
    if "/lib/python3" in filename:
        return "stdlib:" + filename.split("/lib/python3")[-1].split("/", 1)[-1].split("/")[
            0
        ].removesuffix(".py")
    return filename


def entries(*profiles: cProfile.Profile) -> list[tuple[str, str, int, float]]:
    """(file, function, calls, own seconds) of every function the profilers saw, one
    entry per code object: ``pstats`` keys functions by file, line and name, which
    merges the generated ``__init__``s and evolvers of every dataclass (all
    ``<string>:1``) into one and drops the rest of their calls."""
    out = []
    for profile in profiles:
        for e in profile.getstats():
            code = e.code
            if isinstance(code, str):  # a C function: "<method 'poll' of ...>"
                out.append(("~", code, e.callcount, e.inlinetime))
            else:
                out.append((code.co_filename, code.co_name, e.callcount, e.inlinetime))
    return out


def areas(found: list[tuple[str, str, int, float]], sent: int) -> list[str]:
    """Own time per delivery by area, waits left out, largest first."""
    own: Counter[str] = Counter()
    for filename, name, _, seconds in found:
        if not any(wait in name for wait in WAITS):
            own[area(filename)] += seconds
    total = sum(own.values())
    lines = [f"own time {total / sent * 1e6:.0f} us per delivery (waits left out), by area:"]
    for name, seconds in own.most_common(15):
        lines.append(f"  {seconds / total:6.1%}  {seconds / sent * 1e6:7.1f} us  {name}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", help="postgresql:// server (a throw-away database)")
    parser.add_argument("--notifications", type=int, default=10_000)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--dump", help="write the raw profile here (pstats format)")
    parser.add_argument(
        "--library-logging",
        action="store_true",
        help="leave structlog unconfigured, as an application that embeds the worker "
        "does: kirim's lines go to the standard library's kirim logger (at its default "
        "level, warning); without it the worker logs as kirim bench's do",
    )
    args = parser.parse_args()
    if not args.library_logging:
        configure(level="warning")
    profile = None if args.no_profile else cProfile.Profile()
    in_thread = None if args.no_profile else cProfile.Profile()
    with (
        tempfile.TemporaryDirectory(prefix="kirim-prof-") as tmp,
        scratch(args.database, Path(tmp)) as url,
    ):
        asyncio.run(_enqueue(url, args.notifications, 0))
        sent, wall, cpu = asyncio.run(_drain(url, profile, in_thread))
    print(
        f"{sent:,} delivered in {wall:.2f}s ({sent / wall:,.0f}/s), "
        f"worker CPU {cpu / sent * 1e6:.1f} us/delivery"
        + (" (under cProfile: inflated)" if profile is not None else "")
    )
    if profile is None:
        return
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    if in_thread is not None and in_thread.getstats():
        stats.add(in_thread)  # SQLite's thread: both threads' calls together
    if args.dump:
        stats.dump_stats(args.dump)
    found = entries(profile, *([in_thread] if in_thread is not None else []))
    total_calls = sum(calls for _, _, calls, _ in found)
    print(f"{total_calls / sent:.0f} function calls per delivery (both threads)")
    print("\n".join(areas(found, sent)))
    for order in ("tottime", "cumulative"):
        stats.sort_stats(order).print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
