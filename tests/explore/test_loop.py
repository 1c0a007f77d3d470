"""The deterministic loop: ordering, virtual time, threads, hosts (pins CPython internals)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from kirim.explore.loop import (
    HOST,
    Deadlock,
    DeterministicLoop,
    Host,
    StepLimit,
    host_context,
)
from kirim.explore.policy import HostPolicy, PCTPolicy, RandomPolicy, ReplayPolicy


def run(loop: DeterministicLoop, coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def test_one_host_runs_its_callbacks_in_fifo_order() -> None:
    """Within one host, call_soon callbacks run in the order they were registered."""
    loop = DeterministicLoop(HostPolicy(1))
    seen: list[int] = []

    async def main() -> None:
        for i in range(20):
            loop.call_soon(seen.append, i)
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    run(loop, main())
    assert seen == list(range(20))


def test_timers_jump_virtual_time_without_waiting() -> None:
    """An hour of asyncio.sleep takes no real time; time() is exactly the sum slept."""
    loop = DeterministicLoop(HostPolicy(1), start=5.0)

    async def main() -> float:
        await asyncio.sleep(3600)
        await asyncio.sleep(0.25)
        return loop.time()

    began = time.perf_counter()
    assert run(loop, main()) == 3605.25
    assert time.perf_counter() - began < 1.0


def test_timers_fire_in_deadline_order_then_creation_order() -> None:
    """call_later fires by deadline; equal deadlines fire in the order they were set."""
    loop = DeterministicLoop(HostPolicy(1))
    seen: list[str] = []

    async def main() -> None:
        loop.call_later(2.0, seen.append, "late")
        loop.call_later(1.0, seen.append, "first")
        loop.call_later(1.0, seen.append, "second")
        await asyncio.sleep(3.0)

    run(loop, main())
    assert seen == ["first", "second", "late"]


def test_one_callback_per_step_and_every_multi_choice_recorded() -> None:
    """Each step runs one callback; a choice is recorded only when two hosts are ready."""
    loop = DeterministicLoop(HostPolicy(3))
    a, b = Host("A"), Host("B")

    async def work(n: int) -> None:
        for _ in range(n):
            await asyncio.sleep(0)

    async def main() -> None:
        ta = loop.create_task(work(5), context=host_context(a))
        tb = loop.create_task(work(5), context=host_context(b))
        await asyncio.gather(ta, tb)

    run(loop, main())
    assert loop.choices
    assert all(c in (0, 1) for c in loop.choices)
    assert loop.steps >= 12


def test_replaying_the_choices_gives_the_same_order() -> None:
    """A run replayed from its recorded choices interleaves the hosts identically."""

    def interleaving(policy: Any) -> tuple[list[str], list[int]]:
        loop = DeterministicLoop(policy)
        seen: list[str] = []

        async def work(name: str) -> None:
            for i in range(6):
                seen.append(f"{name}{i}")
                await asyncio.sleep(0)

        async def main() -> None:
            tasks = [
                loop.create_task(work(n), context=host_context(Host(n))) for n in ("a", "b", "c")
            ]
            await asyncio.gather(*tasks)

        run(loop, main())
        return seen, loop.choices

    for policy in (RandomPolicy(7), HostPolicy(7), PCTPolicy(7, 3)):
        first, choices = interleaving(policy)
        again, _ = interleaving(ReplayPolicy(choices, grouped=policy.grouped))
        assert again == first
    assert interleaving(RandomPolicy(1))[0] != interleaving(RandomPolicy(2))[0]


def test_an_empty_replay_is_the_default_fifo_order() -> None:
    """Choice 0 everywhere is asyncio's own order: the oldest ready callback first."""
    loop = DeterministicLoop(ReplayPolicy([], grouped=False))
    seen: list[str] = []

    async def work(name: str) -> None:
        for i in range(3):
            seen.append(f"{name}{i}")
            await asyncio.sleep(0)

    async def main() -> None:
        t1 = loop.create_task(work("a"), context=host_context(Host("A")))
        t2 = loop.create_task(work("b"), context=host_context(Host("B")))
        await asyncio.gather(t1, t2)

    run(loop, main())
    assert seen == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_run_in_executor_runs_inline_on_the_loop_thread() -> None:
    """run_in_executor calls the function at a step of its own, on the loop's thread."""
    loop = DeterministicLoop(HostPolicy(1))
    where: list[int] = []

    def blocking(x: int) -> int:
        where.append(threading.get_ident())
        return x * 2

    async def main() -> int:
        return await loop.run_in_executor(None, blocking, 21)

    assert run(loop, main()) == 42
    assert where == [threading.get_ident()]


def test_calls_from_another_thread_are_errors() -> None:
    """call_soon_threadsafe and run_in_executor from another thread raise RuntimeError."""
    loop = DeterministicLoop(HostPolicy(1))
    errors: list[BaseException] = []

    def other() -> None:
        for call in (
            lambda: loop.call_soon_threadsafe(print),
            lambda: loop.run_in_executor(None, print),
        ):
            try:
                call()
            except RuntimeError as exc:
                errors.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    loop.close()
    assert len(errors) == 2


def test_a_crashed_host_never_resumes_and_runs_no_finally() -> None:
    """Crash drops the host's callbacks and timers; its finally blocks do not run."""
    loop = DeterministicLoop(HostPolicy(1))
    victim = Host("A")
    events: list[str] = []

    async def doomed() -> None:
        try:
            await asyncio.sleep(10)
            events.append("resumed")
        finally:
            events.append("finally")

    async def main() -> None:
        loop.create_task(doomed(), context=host_context(victim))
        await asyncio.sleep(1)
        loop.crash(victim)
        await asyncio.sleep(20)
        events.append(f"survivor at {loop.time()}")

    loop.run_until_complete(main())
    assert events == ["survivor at 21.0"]
    loop.close()


def test_a_stalled_host_waits_until_its_stall_ends() -> None:
    """A stalled host's ready callbacks run only once virtual time reaches the stall's end."""
    loop = DeterministicLoop(HostPolicy(1))
    stalled = Host("A")
    seen: list[float] = []

    async def tick() -> None:
        seen.append(loop.time())  # the task's first step waits for the stall's end
        await asyncio.sleep(1)
        seen.append(loop.time())

    async def main() -> None:
        loop.stall(stalled, 15.0)
        await loop.create_task(tick(), context=host_context(stalled))

    run(loop, main())
    assert seen == [15.0, 16.0]


def test_tasks_and_callbacks_inherit_their_host() -> None:
    """A task created inside a host's task belongs to the same host."""
    loop = DeterministicLoop(HostPolicy(1))
    host = Host("A")

    async def child() -> str | None:
        current = HOST.get()
        return None if current is None else current.label

    async def parent() -> str | None:
        return await asyncio.create_task(child())

    async def main() -> str | None:
        return await loop.create_task(parent(), context=host_context(host))

    assert run(loop, main()) == "A"


def test_task_factories_are_refused() -> None:
    """Eager (or any) task factories are refused: a task's first step is a decision."""
    loop = DeterministicLoop(HostPolicy(1))
    factory = getattr(asyncio, "eager_task_factory", lambda loop, coro: None)
    with pytest.raises(RuntimeError):
        loop.set_task_factory(factory)
    loop.close()


def test_deadlock_and_step_limit_are_reported() -> None:
    """Waiting on a future nobody sets is a Deadlock; too many steps is a StepLimit."""
    loop = DeterministicLoop(HostPolicy(1))
    with pytest.raises(Deadlock):
        loop.run_until_complete(loop.create_future())
    loop.close()
    loop = DeterministicLoop(HostPolicy(1), max_steps=50)

    async def spin() -> None:
        for _ in range(10_000):
            await asyncio.sleep(0)

    with pytest.raises(StepLimit):
        loop.run_until_complete(spin())
    loop.close()


def test_pinned_python_versions() -> None:
    """The internals the loop relies on exist on this interpreter (3.11 and 3.12)."""
    assert sys.version_info[:2] >= (3, 11)
    loop = DeterministicLoop(HostPolicy(1))
    handle = loop.call_soon(print)
    for name in ("_context", "_callback"):
        assert hasattr(handle, name)
    for name in ("_stopping", "_run_once"):
        assert hasattr(loop, name)
    handle.cancel()
    loop.close()
