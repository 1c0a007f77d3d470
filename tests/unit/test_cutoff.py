"""Provider calls are cut off at their request timeout by one shared timer."""

from __future__ import annotations

import asyncio

import pytest

from kirim.channels import Channel
from kirim.errors import AmbiguousFailure
from kirim.model import AttemptStatus
from kirim.providers.base import Message, Sent
from kirim.testing import ManualClock
from kirim.worker import Worker, WorkerSettings

MESSAGE = Message(
    delivery_id=1,
    idempotency_key="k",
    provider_request_id="r",
    event_id="e",
    recipient="u",
    channel="push",
    payload={},
    attempt=1,
)


class Silent:
    """Never answers until told; counts how its calls ended."""

    idempotent = False

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.cancelled = 0

    async def send(self, message: Message) -> Sent:
        try:
            await self.answer.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return Sent(provider_message_id="m")


class NoStore:
    """The worker's store is never touched by ``_call``."""

    async def record_intents(self, intents: object) -> list[bool]:
        raise AssertionError("not used")

    async def finish(self, items: object) -> list[object]:
        raise AssertionError("not used")


def worker(provider: Silent) -> tuple[Worker, Channel]:
    channel = Channel(name="push", provider=provider)
    settings = WorkerSettings()
    return Worker(NoStore(), {"push": channel}, settings=settings, clock=ManualClock()), channel


async def test_a_call_past_its_limit_is_cut_off_as_unknown() -> None:
    """A provider that never answers is given up at the limit: the outcome is unknown."""
    provider = Silent()
    w, channel = worker(provider)
    status, sent, error = await w._call(channel, MESSAGE, 0.05)
    assert (status, sent) == (AttemptStatus.UNKNOWN, None)
    assert isinstance(error, AmbiguousFailure)
    assert provider.cancelled == 1


async def test_calls_that_answer_are_not_cut_later() -> None:
    """An answered call leaves nothing behind that could cancel its task afterwards."""
    provider = Silent()
    provider.answer.set()
    w, channel = worker(provider)
    results = [await w._call(channel, MESSAGE, 0.05) for _ in range(3)]
    assert [r[0] for r in results] == [AttemptStatus.SUCCEEDED] * 3
    await asyncio.sleep(0.1)  # past every limit: the task must not be cancelled now
    assert asyncio.current_task().cancelling() == 0


async def test_a_shutdown_cancel_is_not_taken_for_the_timeout() -> None:
    """Cancelling the delivery task (a shutdown) propagates; it is no outcome."""
    provider = Silent()
    w, channel = worker(provider)
    task = asyncio.create_task(w._call(channel, MESSAGE, 30.0))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_shorter_limits_among_longer_ones_are_cut_first() -> None:
    """A call with a short limit is cut on time while a long one keeps waiting."""
    provider = Silent()
    w, channel = worker(provider)
    long = asyncio.create_task(w._call(channel, MESSAGE, 30.0))
    await asyncio.sleep(0)
    status, _, _ = await w._call(channel, MESSAGE, 0.05)
    assert status is AttemptStatus.UNKNOWN
    assert not long.done()
    provider.answer.set()
    assert (await long)[0] is AttemptStatus.SUCCEEDED
