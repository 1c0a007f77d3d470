"""The worker processes of a chaos run: started, frozen, killed, and always ended.

``kirim simulate`` (``harness``) and ``kirim demo`` run their workers as a ``Fleet``:
each process by id (``worker-1``, ``worker-2``…), its log in the run's folder, its
clock offset drawn from ``Offsets``; ``stall`` freezes one (SIGSTOP) until ``tick``
continues it (SIGCONT), ``kill`` ends one (SIGKILL), ``close`` ends every process
started (a stopped one gets SIGCONT before SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import IO

from kirim.simulate.skew import Offsets

__all__ = ["Fleet"]


class Fleet:
    """The worker processes of one run, by id; stalls and kills; the final cleanup."""

    def __init__(
        self, argv: Callable[[str, float], list[str]], folder: Path, offsets: Offsets
    ) -> None:
        self._argv = argv
        self._folder = folder
        self._offsets = offsets
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.clock_offsets: dict[str, float] = {}  # each worker's clock, seconds off
        self.thaw_at: dict[str, float] = {}  # stopped workers and when to continue them
        self.killed: set[str] = set()
        self.crashes: list[str] = []
        self._logs: dict[str, IO[bytes]] = {}
        self._reported: set[str] = set()
        self.kills = self.stalls = 0

    def start(self) -> str:
        worker_id = f"worker-{len(self.procs) + 1}"
        log = (self._folder / f"{worker_id}.log").open("wb")
        self._logs[worker_id] = log
        env = {k: v for k, v in os.environ.items() if k != "KIRIM_DATABASE_URL"}
        env["PYTHONUNBUFFERED"] = "1"
        offset = self.clock_offsets[worker_id] = self._offsets.draw()
        self.procs[worker_id] = subprocess.Popen(
            self._argv(worker_id, offset), stdout=subprocess.DEVNULL, stderr=log, env=env
        )
        return worker_id

    def running(self) -> list[str]:
        """Workers alive and not stopped, by id."""
        return [w for w, p in self.procs.items() if p.poll() is None and w not in self.thaw_at]

    def busy(self) -> bool:
        return bool(self.thaw_at) or any(p.poll() is None for p in self.procs.values())

    def kill(self, worker_id: str) -> None:
        proc = self.procs[worker_id]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.killed.add(worker_id)
        self.kills += 1

    def stall(self, worker_id: str, until: float) -> None:
        self.procs[worker_id].send_signal(signal.SIGSTOP)
        self.thaw_at[worker_id] = until
        self.stalls += 1

    def tick(self, now: float) -> None:
        """Continue the stalls that are over; note workers that died on their own."""
        for worker_id, when in list(self.thaw_at.items()):
            if now >= when:
                self.procs[worker_id].send_signal(signal.SIGCONT)
                del self.thaw_at[worker_id]
        for worker_id, proc in self.procs.items():
            code = proc.poll()
            if code not in (None, 0) and worker_id not in self.killed | self._reported:
                self._reported.add(worker_id)
                self.crashes.append(f"{worker_id} exited {code}: {self._last_line(worker_id)}")

    def _last_line(self, worker_id: str) -> str:
        self._logs[worker_id].flush()
        lines = (self._folder / f"{worker_id}.log").read_text(errors="replace").splitlines()
        return lines[-1][:300] if lines else "(no output)"

    def close(self) -> None:
        """SIGCONT the stopped, then SIGKILL whatever still runs; close the logs."""
        for worker_id in list(self.thaw_at):
            with contextlib.suppress(ProcessLookupError):
                self.procs[worker_id].send_signal(signal.SIGCONT)
        self.thaw_at.clear()
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
                proc.wait()
        for log in self._logs.values():
            log.close()
