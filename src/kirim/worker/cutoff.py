"""Provider calls cut off at their request timeout, with one timer per worker.

The settle bound of an attempt relies on its request being given up after the
request timeout (``Deliverer.call``). ``asyncio.timeout`` around every call costs a
timer, a context manager and a cancel per request (about 5% of a worker's time on
SQLite); here the calls in flight share one timer, set for the earliest cut-off,
and each call costs a dict entry.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

Task = asyncio.Task[Any]


class Cutoffs:
    """The provider calls in flight and when each must be cut off (the loop's time)."""

    def __init__(self) -> None:
        self._due: dict[Task, float] = {}
        self._cut: set[Task] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def start(self, limit: float) -> Task:
        """Register the current task's call: cut it off ``limit`` seconds from now."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a provider call must run in a task")
        loop = asyncio.get_running_loop()
        at = loop.time() + limit
        self._due[task] = at
        if at < self._timer_at:
            self._arm(loop, at)
        return task

    def was_cut(self, task: Task) -> bool:
        """Whether a CancelledError in ``task`` is this cut-off (it is then absorbed);
        False: someone else cancelled the task (a shutdown), and it must propagate."""
        if task not in self._cut:
            return False
        self._cut.discard(task)
        task.uncancel()
        return True

    def done(self, task: Task) -> None:
        """The call is over (answered, failed or cut off)."""
        self._due.pop(task, None)
        if task in self._cut:  # cut, but the provider swallowed the cancellation
            self._cut.discard(task)
            task.uncancel()

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = loop.call_at(at, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer, self._timer_at = None, math.inf
        now = loop.time()
        for task, at in list(self._due.items()):
            if at <= now and task not in self._cut and not task.done():
                self._cut.add(task)
                task.cancel()
        later = [at for task, at in self._due.items() if task not in self._cut]
        if later:
            self._arm(loop, min(later))
