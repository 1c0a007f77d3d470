"""Helpers for testing code that uses kirim, and kirim itself.

- ``ManualClock``: time that moves only when the test says so.
- ``FlakyProvider``: an in-process provider with latency, failures,
  accept-then-time-out, and a count of requests per idempotency key.
- ``Checkpoints``: pause a worker at a named point (``after_claim``,
  ``before_provider_request``, ``after_provider_response``, ``before_commit``) so a
  test can interleave two workers exactly, or make it die there (it implements
  ``kirim.worker.checkpoint.Checkpoint``).
- ``NullProvider``: accepts everything at once, for benchmarks.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from kirim.errors import AmbiguousFailure, PermanentFailure, TransientFailure
from kirim.providers.base import Message, Sent
from kirim.providers.null import NullProvider
from kirim.worker.checkpoint import CHECKPOINTS


class ManualClock:
    """A clock for tests: ``now`` changes only through ``advance`` or ``set``."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        """Seconds on the same manual time line (for deadlines)."""
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def set(self, now: float) -> None:
        self._now = now

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)


class WorkerCrashed(BaseException):
    """Raised inside a worker at a checkpoint to make it die on the spot.

    It derives from BaseException so that no ``except Exception`` in the worker
    turns the crash into a tidy shutdown: nothing more is written, as after SIGKILL.
    """


@dataclass
class Pause:
    """One armed checkpoint; the worker that reaches it waits for the test."""

    name: str
    worker_id: str | None
    _reached: asyncio.Event = field(default_factory=asyncio.Event)
    _go: asyncio.Event = field(default_factory=asyncio.Event)
    _crash: bool = False
    context: dict[str, Any] = field(default_factory=dict)

    async def reached(self, within: float = 10.0) -> dict[str, Any]:
        """Wait until a worker stands at the checkpoint; return its context."""
        await asyncio.wait_for(self._reached.wait(), within)
        return self.context

    def release(self) -> None:
        """Let the worker go on."""
        self._go.set()

    def crash(self) -> None:
        """Make the worker die at the checkpoint, writing nothing more."""
        self._crash = True
        self._go.set()


class Checkpoints:
    """Named pause points inside a worker."""

    def __init__(self) -> None:
        self._armed: list[Pause] = []
        self.passed: list[tuple[str, str, int]] = []  # (checkpoint, worker_id, delivery_id)

    def pause(self, name: str, *, worker_id: str | None = None) -> Pause:
        """Arm ``name`` once (for one worker, or any): the next arrival waits."""
        if name not in CHECKPOINTS:
            raise ValueError(f"unknown checkpoint {name!r}; one of {', '.join(CHECKPOINTS)}")
        pause = Pause(name=name, worker_id=worker_id)
        self._armed.append(pause)
        return pause

    async def hit(self, name: str, *, worker_id: str, delivery_id: int, **context: Any) -> None:
        """Called by the worker at each checkpoint."""
        self.passed.append((name, worker_id, delivery_id))
        for pause in self._armed:
            if pause.name == name and pause.worker_id in (None, worker_id):
                self._armed.remove(pause)
                pause.context = {"worker_id": worker_id, "delivery_id": delivery_id, **context}
                pause._reached.set()
                await pause._go.wait()
                if pause._crash:
                    raise WorkerCrashed(f"{worker_id} crashed at {name}")
                return


#: what a ``FlakyProvider`` does with one request (see its docstring)
Behaviour = Literal["ok", "transient", "permanent", "ambiguous", "accept_then_timeout"]


class FlakyProvider:
    """An in-process provider that misbehaves on purpose.

    ``script`` lists the behaviour of the first requests in order (then ``ok``):
    ``ok``, ``transient`` (refused, not processed), ``permanent`` (4xx),
    ``ambiguous`` (5xx, not processed), ``accept_then_timeout`` (delivered, then the
    answer is lost). ``idempotent=True`` makes it deduplicate by key as a provider
    that honours Idempotency-Key does.
    """

    def __init__(
        self,
        *,
        idempotent: bool = True,
        script: list[Behaviour] | None = None,
        latency: float = 0.0,
        on_request: Callable[[Message], Awaitable[None]] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.idempotent = idempotent
        self.script = list(script or [])
        self.latency = latency
        self.on_request = on_request
        self.retry_after = retry_after
        self.requests: list[Message] = []
        self.per_key: Counter[str] = Counter()  # every request seen
        self.delivered: Counter[str] = Counter()  # what the user received
        self._message_ids: dict[str, str] = {}
        self._ids = itertools.count(1001)

    def received(self, key: str) -> int:
        return self.per_key[key]

    def effective(self, key: str) -> int:
        """How many times the user received the notification with this key."""
        return self.delivered[key]

    async def send(self, message: Message) -> Sent:
        behaviour: Behaviour = self.script.pop(0) if self.script else "ok"
        self.requests.append(message)
        self.per_key[message.idempotency_key] += 1
        if self.latency:
            await asyncio.sleep(self.latency)
        if behaviour == "transient":
            raise TransientFailure("refused (test)", status_code=429, retry_after=self.retry_after)
        if behaviour == "permanent":
            raise PermanentFailure("rejected (test)", status_code=400)
        if behaviour == "ambiguous":
            raise AmbiguousFailure("HTTP 503 (test)", status_code=503)
        sent = self._deliver(message.idempotency_key)
        if self.on_request is not None:
            await self.on_request(message)
        if behaviour == "accept_then_timeout":
            raise AmbiguousFailure("read timeout after the request was accepted (test)")
        return sent

    def _deliver(self, key: str) -> Sent:
        if self.idempotent and key in self._message_ids:
            return Sent(provider_message_id=self._message_ids[key])
        self.delivered[key] += 1
        message_id = f"p-{next(self._ids)}"
        self._message_ids.setdefault(key, message_id)
        return Sent(provider_message_id=message_id)

    async def lookup(self, idempotency_key: str) -> Sent | None:
        """Whether this provider already accepted ``idempotency_key``."""
        if idempotency_key in self._message_ids:
            return Sent(provider_message_id=self._message_ids[idempotency_key])
        return None

    async def aclose(self) -> None:
        return None


class GatedProvider(FlakyProvider):
    """A ``FlakyProvider`` whose first ``gated`` requests wait at a gate the test opens.

    A gated request lives on the provider's side: cancelling the caller (a worker
    stopping or crashing) does not stop it, and it lands when ``open(i)`` is called,
    as a slow request already on the wire would. ``effect`` is what happens when it
    lands (by default ``FlakyProvider.send``); override it to script late answers.
    """

    def __init__(self, *, gated: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gated = gated
        self.gates: list[asyncio.Event] = []
        self.arrivals: list[Message] = []
        self._arrived = asyncio.Event()
        self._landing: list[asyncio.Task[Sent]] = []

    async def send(self, message: Message) -> Sent:
        self.arrivals.append(message)
        if len(self.gates) >= self.gated:
            return await self.effect(message)
        gate = asyncio.Event()
        self.gates.append(gate)
        self._arrived.set()
        landing = asyncio.ensure_future(self._land(gate, message))
        self._landing.append(landing)
        return await asyncio.shield(landing)

    async def _land(self, gate: asyncio.Event, message: Message) -> Sent:
        await gate.wait()
        return await self.effect(message)

    async def effect(self, message: Message) -> Sent:
        return await FlakyProvider.send(self, message)

    def open(self, index: int) -> None:
        """Let the ``index``-th gated request land."""
        self.gates[index].set()

    async def wait_requests(self, count: int, within: float = 10.0) -> None:
        """Wait until ``count`` gated requests have arrived."""
        async with asyncio.timeout(within):
            while len(self.gates) < count:
                self._arrived.clear()
                await self._arrived.wait()

    async def drain(self) -> None:
        """Wait for every gated request that was let through to land."""
        await asyncio.gather(*self._landing, return_exceptions=True)


__all__ = [
    "CHECKPOINTS",
    "Behaviour",
    "Checkpoints",
    "FlakyProvider",
    "GatedProvider",
    "ManualClock",
    "NullProvider",
    "Pause",
    "WorkerCrashed",
]
