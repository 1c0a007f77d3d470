"""A deterministic asyncio event loop: virtual time, one seeded choice per step.

The design is borrowed (ideas only, no code) from published work:

- FoundationDB's deterministic simulation: the whole cluster runs in one process,
  on one thread, with simulated time, so a seed names one exact execution;
- TigerBeetle's VOPR: a failing run is replayed from its seed, and shrunk;
- Rust's shuttle and Microsoft's Coyote: the scheduler, not the OS, decides which
  ready task runs, with random and PCT strategies, and records its decisions so a
  failure replays from its trace;
- Burckhardt, Kothari, Musuvathi, Nagarakatte, "A Randomized Scheduler with
  Probabilistic Guarantees of Finding Bugs" (ASPLOS 2010): the PCT scheduler.

``DeterministicLoop`` runs ONE ready callback per iteration of ``_run_once``; which
one is the policy's choice (see ``policy.py``), recorded in ``choices``. Time is
virtual: when nothing is ready, ``time()`` jumps to the earliest timer.
``run_in_executor`` runs the function inline, at a step of its own, so blocking
store calls (SQLite) become single atomic steps. Every callback belongs to the
*host* of the context it was scheduled in (``HOST``); a host can crash (its
callbacks and timers are dropped, its tasks never resume: no ``finally`` runs
while the loop lives) or stall (SIGSTOP-like: its callbacks wait until a time).

It relies on CPython's ``BaseEventLoop`` internals (``_run_once``, ``_stopping``,
``Handle._context``, ``Handle._callback``); ``tests/explore/test_loop.py`` pins the
behaviour that matters on every supported version. Task factories (eager tasks of
3.12) are refused: a task's first step must be a scheduling decision too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import heapq
import itertools
import threading
import warnings
import weakref
from collections.abc import Callable, Hashable
from contextvars import Context, ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kirim.explore.policy import Policy

T = TypeVar("T")
#: epoch seconds at virtual time 0 (the hosts' clocks and the store's time of record)
BASE = 1_800_000_000.0
#: the worker hosts' labels, in order (a world's workers by index)
WORKER_NAMES = ("A", "B", "C")


@dataclass(eq=False, slots=True)
class Host:
    """A simulated process: its callbacks are chosen, crashed and stalled together."""

    name: str
    incarnation: int = 1
    dead: bool = False
    stalled_until: float = 0.0
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.name if self.incarnation == 1 else f"{self.name}#{self.incarnation}"


HOST: ContextVar[Host | None] = ContextVar("kirim_explore_host", default=None)
#: callbacks scheduled outside any host (the loop's own) belong to this one
LOOP_HOST = Host("loop")


class Deadlock(RuntimeError):
    """Nothing is ready, no timer is set, and the loop was not stopped."""


class StepLimit(RuntimeError):
    """The run took more steps than its budget."""


def host_context(host: Host) -> Context:
    """A context whose tasks and callbacks belong to ``host``."""
    ctx = Context()
    ctx.run(HOST.set, host)
    return ctx


Item = tuple[tuple[int, int, int], asyncio.Handle, Host]


class DeterministicLoop(asyncio.BaseEventLoop):
    def __init__(self, policy: Policy, *, start: float = 0.0, max_steps: int = 2_000_000) -> None:
        super().__init__()
        self.policy = policy
        self.max_steps = max_steps
        self.choices: list[int] = []
        self.steps = 0
        self._now = start
        self._owner_thread = threading.get_ident()
        self._items: list[Item] = []
        self._timers: list[tuple[float, int, asyncio.TimerHandle]] = []
        self._seq = itertools.count()
        self._task_seq: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = (
            weakref.WeakKeyDictionary()
        )
        self._crashed: list[asyncio.Task[Any]] = []

    # -- time --------------------------------------------------------------------

    def time(self) -> float:
        return self._now

    # -- scheduling --------------------------------------------------------------

    @staticmethod
    def _host_of(context: Context | None) -> Host:
        host = HOST.get() if context is None else context.get(HOST)
        return LOOP_HOST if host is None else host

    def _key(self, handle: asyncio.Handle) -> tuple[int, int, int]:
        """(step, owning task's number or -1, sequence): a FIFO order that does not
        depend on the iteration order of sets of tasks."""
        owner = getattr(getattr(handle, "_callback", None), "__self__", None)
        number = -1
        if isinstance(owner, asyncio.Task):
            number = self._task_seq.get(owner, -1)
            if number < 0:
                number = self._task_seq[owner] = next(self._seq)
        return (self.steps, number, next(self._seq))

    def _enqueue(self, handle: asyncio.Handle) -> None:
        host = self._host_of(getattr(handle, "_context", None))
        if not host.dead:
            self._items.append((self._key(handle), handle, host))

    def call_soon(  # type: ignore[override]
        self, callback: Callable[..., object], *args: Any, context: Context | None = None
    ) -> asyncio.Handle:
        self._check_closed()  # type: ignore[attr-defined]
        self._check_owner()
        handle = asyncio.Handle(callback, args, self, context)
        self._enqueue(handle)
        return handle

    def _call_soon(self, callback: Any, args: Any, context: Any) -> asyncio.Handle:
        return self.call_soon(callback, *args, context=context)

    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        self._check_closed()  # type: ignore[attr-defined]
        self._check_owner()
        timer = asyncio.TimerHandle(when, callback, args, self, context)
        if self._host_of(getattr(timer, "_context", None)).dead:
            return timer
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    def call_soon_threadsafe(  # type: ignore[override]
        self, callback: Callable[..., object], *args: Any, context: Context | None = None
    ) -> asyncio.Handle:
        self._check_owner()
        return self.call_soon(callback, *args, context=context)

    def _check_owner(self) -> None:
        if threading.get_ident() != self._owner_thread:
            raise RuntimeError("DeterministicLoop: called from another thread")

    def _write_to_self(self) -> None:
        return None

    def _process_events(self, event_list: Any) -> None:
        return None

    def set_task_factory(self, factory: Any) -> None:
        if factory is not None:
            raise RuntimeError("DeterministicLoop: task factories (eager tasks) are refused")

    def create_task(  # type: ignore[override]
        self, coro: Any, *, name: str | None = None, context: Context | None = None
    ) -> Any:
        task = super().create_task(coro, name=name, context=context)
        host = self._host_of(context)
        if host is not LOOP_HOST:
            host.tasks.append(task)
        return task

    def run_in_executor(  # type: ignore[override]
        self, executor: concurrent.futures.Executor | None, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        """Run ``func(*args)`` inline, at a step of its own chosen like any other."""
        self._check_closed()  # type: ignore[attr-defined]
        self._check_owner()
        future: asyncio.Future[T] = self.create_future()

        def run() -> None:
            if future.cancelled():
                return
            try:
                result = func(*args)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        self.call_soon(run)
        return future

    # -- the step ------------------------------------------------------------------

    def _release_timers(self) -> None:
        while self._timers and self._timers[0][0] <= self._now:
            _, _, timer = heapq.heappop(self._timers)
            timer._scheduled = False  # type: ignore[attr-defined]
            if not timer.cancelled():
                self._enqueue(timer)

    def _eligible(self) -> list[Item]:
        items = [it for it in self._items if not it[1].cancelled() and not it[2].dead]
        self._items = items
        return [it for it in items if it[2].stalled_until <= self._now]

    def _next_wakeup(self) -> float | None:
        while self._timers and self._timers[0][2].cancelled():
            heapq.heappop(self._timers)
        times = [it[2].stalled_until for it in self._items]
        if self._timers:
            times.append(self._timers[0][0])
        return min(times) if times else None

    def _run_once(self) -> None:
        while True:
            self._release_timers()
            eligible = self._eligible()
            if eligible:
                break
            if self._stopping:  # type: ignore[attr-defined]
                return
            wakeup = self._next_wakeup()
            if wakeup is None:
                raise Deadlock("nothing is ready and no timer is set")
            self._now = max(self._now, wakeup)
        self.steps += 1
        if self.steps > self.max_steps:
            raise StepLimit(f"more than {self.max_steps} steps")
        eligible.sort(key=lambda it: it[0])
        chosen = eligible[0] if len(eligible) == 1 else self._choose(eligible)
        self._items.remove(chosen)
        chosen[1]._run()

    def _choose(self, eligible: list[Item]) -> Item:
        if self.policy.grouped:
            hosts: list[Host] = []
            first: list[Item] = []
            for it in eligible:
                if it[2] not in hosts:
                    hosts.append(it[2])
                    first.append(it)
            if len(hosts) == 1:
                return first[0]
            index = self.policy.pick(hosts, self.steps)
            self.choices.append(index)
            return first[index]
        owners: list[Hashable] = []
        for it in eligible:
            owner = getattr(getattr(it[1], "_callback", None), "__self__", None)
            owners.append(owner if isinstance(owner, asyncio.Task) else it[2])
        index = self.policy.pick(owners, self.steps)
        self.choices.append(index)
        return eligible[index]

    # -- faults --------------------------------------------------------------------

    def crash(self, host: Host) -> None:
        """SIGKILL: drop the host's callbacks and timers; its tasks never resume."""
        host.dead = True
        self._items = [it for it in self._items if it[2] is not host]
        self._timers = [t for t in self._timers if self._host_of(t[2]._context) is not host]  # type: ignore[attr-defined]
        heapq.heapify(self._timers)
        for task in host.tasks:
            if not task.done():
                task._log_destroy_pending = False  # type: ignore[attr-defined]
                self._crashed.append(task)
        host.tasks.clear()

    def stall(self, host: Host, until: float) -> None:
        """SIGSTOP until virtual time ``until`` (then SIGCONT)."""
        host.stalled_until = max(host.stalled_until, until)

    def close(self) -> None:
        self._items.clear()
        self._timers.clear()
        crashed, self._crashed = self._crashed, []
        super().close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for task in crashed:  # after the run: their finally blocks cannot touch it
                coro = task.get_coro()
                close = getattr(coro, "close", None)
                if close is not None:
                    with contextlib.suppress(BaseException):  # a dead host's last words
                        close()
