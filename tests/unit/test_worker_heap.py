"""The worker's heap: what was allocated before ``Worker.run`` is frozen out of the
cyclic collector's full passes while it runs, and put back when the last one ends."""

from __future__ import annotations

import gc

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
