"""The worker's heap: what was allocated before ``Worker.run`` is frozen out of the
cyclic collector's full passes while it runs, and put back when the last one ends."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from kirim.providers.base import Message, Sent
from kirim.testing import FlakyProvider
from kirim.worker.heap import frozen_heap
from kirim.worker.settings import WorkerSettings


def _frozen(obj: object) -> bool:
    """``obj`` is out of the collector's generations (frozen). Not by the freeze
    count: frozen objects freed by reference counting lower it at any time."""
    return not any(o is obj for o in gc.get_objects())


def test_the_heap_is_frozen_while_a_worker_runs_and_given_back_after() -> None:
    held = [object()]
    with frozen_heap():
        assert _frozen(held)
    assert not _frozen(held)
    assert gc.get_freeze_count() == 0


def test_nested_runs_give_the_heap_back_only_when_the_last_ends() -> None:
    held = [object()]  # allocated before the first worker
    with frozen_heap():
        assert _frozen(held)
        with frozen_heap():  # a second worker in the same process (tests, the explorer)
            assert _frozen(held)
        assert _frozen(held)
    assert not _frozen(held)


def test_a_heap_the_process_froze_itself_stays_frozen() -> None:
    held = [object()]
    gc.freeze()  # as an application that freezes its heap before it forks
    try:
        with frozen_heap():
            pass
        assert _frozen(held)
    finally:
        gc.unfreeze()


async def test_a_burst_worker_sends_with_the_heap_frozen(make_app) -> None:
    seen: list[int] = []

    class Watching(FlakyProvider):
        async def send(self, message: Message) -> Sent:
            seen.append(gc.get_freeze_count())
            return await super().send(message)

    app = await make_app(Watching(script=[]))
    await app.notify("e1", "u", "push", {})
    stats = await app.worker(settings=WorkerSettings(poll_interval=0.01)).run(burst=True)
    assert stats.sent == 1
    assert seen
    assert all(n > 0 for n in seen)
    assert gc.get_freeze_count() == 0


@pytest.fixture
def defaults() -> Iterator[tuple[int, int, int]]:
    """CPython's default thresholds for the test, the process's own put back after."""
    own = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield (700, 10, 10)
    finally:
        gc.set_threshold(*own)


def test_the_young_threshold_is_raised_while_a_worker_runs_and_put_back_after(
    defaults: tuple[int, int, int],
) -> None:
    """While workers run the youngest generation waits for ``YOUNG`` new containers
    (the older generations' thresholds unchanged); the last worker out puts the
    process's threshold back."""
    from kirim.worker.heap import YOUNG

    before = defaults
    with frozen_heap():
        assert gc.get_threshold() == (YOUNG, *before[1:])
        with frozen_heap():
            assert gc.get_threshold() == (YOUNG, *before[1:])
        assert gc.get_threshold() == (YOUNG, *before[1:])
    assert gc.get_threshold() == before


def test_a_threshold_the_process_chose_is_kept(defaults: tuple[int, int, int]) -> None:
    """A higher threshold, collection turned off (0), or a threshold the process set
    while the worker ran: the process's own, left as it is."""
    from kirim.worker.heap import YOUNG

    for own in (YOUNG * 2, 0):
        gc.set_threshold(own, 10, 10)
        with frozen_heap():
            assert gc.get_threshold()[0] == own
        assert gc.get_threshold()[0] == own
    gc.set_threshold(*defaults)
    with frozen_heap():
        gc.set_threshold(1234, 10, 10)  # the application changes it meanwhile
    assert gc.get_threshold()[0] == 1234


async def test_a_burst_worker_sends_with_the_young_threshold_raised(
    make_app, defaults: tuple[int, int, int]
) -> None:
    """A worker's deliveries run with the raised threshold; the default comes back."""
    from kirim.worker.heap import YOUNG

    seen: list[int] = []

    class Watching(FlakyProvider):
        async def send(self, message: Message) -> Sent:
            seen.append(gc.get_threshold()[0])
            return await super().send(message)

    before = defaults
    app = await make_app(Watching(script=[]))
    await app.notify("e1", "u", "push", {})
    stats = await app.worker(settings=WorkerSettings(poll_interval=0.01)).run(burst=True)
    assert stats.sent == 1
    assert seen == [YOUNG]
    assert gc.get_threshold() == before
