"""The provider model: a remote service on its own host, and the ground truth.

``send`` registers the request the moment it is called (the request left), then
a task on the provider's host applies the effect after an *effect delay* and
answers after a *response delay*. A worker that crashes meanwhile does not stop
the request: it lands anyway. An answer later than ``timeout`` reaches the caller
as ``AmbiguousFailure("timeout")`` at ``timeout``, as an HTTP client's would.

Outcomes, drawn per request from the seed, the key and the request's number (so
that a schedule change does not redraw the other requests):

=================  =========================================  ===========
outcome            the caller gets                             user gets it
=================  =========================================  ===========
``accepted``       ``Sent``                                    yes
``accepted_lost``  ``AmbiguousFailure`` (the answer was lost)  yes
``refused``        ``TransientFailure`` (connection refused)   no
``5xx``            ``AmbiguousFailure`` (503, not processed)   no
``429``            ``TransientFailure`` (429)                  no
``400``            ``PermanentFailure`` (400)                  no
=================  =========================================  ===========

A quarter of the requests are *slow*: their effect (or their definite failure)
comes after the worker's lease, but the effect never after ``timeout``.
``lookup(key)`` sees an effect only ``lookup_lag`` seconds after it happened, and
fails now and then. ``idempotent``: a key is delivered once however often it is sent.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field

from kirim.errors import AmbiguousFailure, PermanentFailure, TransientFailure
from kirim.explore.loop import HOST, Host, host_context
from kirim.explore.trace import Trace
from kirim.providers.base import Message, Sent

OUTCOMES = (
    ("accepted", 46),
    ("accepted_lost", 12),
    ("refused", 10),
    ("5xx", 10),
    ("429", 14),
    ("400", 8),
)
EFFECT = frozenset({"accepted", "accepted_lost"})


@dataclass(slots=True)
class Request:
    """One request as the provider saw it."""

    key: str
    request_id: str
    caller: str
    sent_at: float
    outcome: str
    effect_at: float | None
    answer_at: float
    answer: str = "pending"  # what the caller got
    #: the event ids of a digest's payload (``events``), as the request carried them
    events: tuple[str, ...] | None = None


@dataclass(slots=True)
class EventRecord:
    """One ``notify_event`` the driver made (the events workload), and its answer."""

    event_id: str
    type: str
    recipients: tuple[str, ...]
    at: float
    #: per recipient x channel: (recipient, delivery id, status, reason, digest stream)
    outcomes: list[tuple[str, int, str, str | None, str | None]] = field(default_factory=list)


@dataclass(slots=True)
class FlipRecord:
    """One change of a recipient's preferences: ``type`` None is the global opt-out,
    else the type on ``channel``; ``off``: opted out (else back in).
    ``started``/``committed``: virtual times the call began and returned (its commit
    lies between)."""

    recipient: str
    type: str | None
    channel: str
    off: bool
    started: float
    committed: float | None = None


@dataclass(slots=True)
class GroundTruth:
    """What really happened, for the invariants."""

    requests: list[Request] = field(default_factory=list)
    received: Counter[str] = field(default_factory=Counter)  # key -> times the user got it
    #: key -> (time, counted) of every effect; counted False: deduplicated by the provider
    effects: dict[str, list[tuple[float, bool]]] = field(default_factory=dict)
    in_flight: int = 0
    #: provider_request_id -> virtual time its intent committed
    intents: dict[str, float] = field(default_factory=dict)
    #: delivery id -> virtual time an operator's cancel committed
    cancels: dict[int, float] = field(default_factory=dict)
    #: delivery id -> virtual times an operator's retry committed
    retries: dict[int, list[float]] = field(default_factory=dict)
    #: the events workload: the events recorded and the preference flips made
    events: list[EventRecord] = field(default_factory=list)
    flips: list[FlipRecord] = field(default_factory=list)

    def epochs(self, key: str, delivery_id: int) -> list[int]:
        """Times the user got ``key``, per epoch between the operator's retries: a
        retry after an earlier request landed is the operator's call, not a duplicate."""
        cuts = sorted(self.retries.get(delivery_id, []))
        counts = [0] * (len(cuts) + 1)
        for at, counted in self.effects.get(key, []):
            if counted:
                counts[sum(1 for c in cuts if c < at)] += 1
        return counts


class ProviderModel:
    """Implements kirim's Provider (and Reconcilable) protocol on the provider host."""

    def __init__(
        self,
        *,
        truth: GroundTruth,
        trace: Trace,
        host: Host,
        seed: int,
        idempotent: bool,
        lease: float,
        timeout: float,
        lookup_lag: float = 2.0,
    ) -> None:
        self.idempotent = idempotent
        self.timeout = timeout
        self.truth = truth
        self.trace = trace
        self.host = host
        self.seed = seed
        self.lease = lease
        self.lookup_lag = lookup_lag
        self._context = host_context(host)
        self._sent: Counter[str] = Counter()
        self._lookups: Counter[str] = Counter()
        self._ids: dict[str, str] = {}
        self._serving: set[asyncio.Task[None]] = set()

    def _draw(self, key: str, now: float) -> tuple[str, float | None, float]:
        n = self._sent[key]
        self._sent[key] += 1
        rng = random.Random(f"provider:{self.seed}:{key}:{n}")
        outcome = rng.choices([o for o, _ in OUTCOMES], [w for _, w in OUTCOMES])[0]
        if self.idempotent:
            # A provider that honours keys answers a known key as it did the first
            # time (a replayed success), and one still being processed with 409.
            earlier = [r.effect_at for r in self.truth.requests if r.key == key]
            landed = [t for t in earlier if t is not None]
            if any(t <= now for t in landed):
                outcome = "accepted"
            elif landed:
                outcome = "409"
        slow = outcome != "refused" and rng.random() < 0.25
        if slow:
            first = rng.uniform(0.3 * self.lease, 0.95 * self.timeout)
            answer = first + rng.uniform(0.0, 0.6 * self.timeout)
        else:
            first = rng.uniform(0.01, 0.5)
            answer = first + rng.uniform(0.01, 0.3)
        effect = now + first if outcome in EFFECT else None
        if outcome not in EFFECT:
            answer = first  # a definite failure is known when it is answered
        return outcome, effect, now + answer

    async def send(self, message: Message) -> Sent:
        loop = asyncio.get_running_loop()
        now = loop.time()
        outcome, effect_at, answer_at = self._draw(message.idempotency_key, now)
        current = HOST.get()
        request = Request(
            key=message.idempotency_key,
            request_id=message.provider_request_id,
            caller="-" if current is None else current.label,
            sent_at=now,
            outcome=outcome,
            effect_at=effect_at,
            answer_at=answer_at,
            events=_events_of(message.payload),
        )
        self.truth.requests.append(request)
        effect = "-" if effect_at is None else f"{effect_at:.3f}"
        self.trace.add(
            f"provider_sees delivery={message.delivery_id} req="
            f"{self.trace.rid(message.provider_request_id)} outcome={outcome} "
            f"effect_at={effect} answer_at={answer_at:.3f}"
        )
        answer: asyncio.Future[str] = loop.create_future()
        self.truth.in_flight += 1
        self._serving.add(loop.create_task(self._serve(request, answer), context=self._context))
        try:
            async with asyncio.timeout(self.timeout):
                result = await answer
        except TimeoutError:
            request.answer = "timeout"
            raise AmbiguousFailure("timeout (no answer within the client timeout)") from None
        request.answer = result
        if result == "accepted":
            return Sent(provider_message_id=self._ids.get(request.key))
        if result == "accepted_lost":
            raise AmbiguousFailure("connection reset after the request was written")
        if result == "refused":
            raise TransientFailure("connection refused")
        if result == "5xx":
            raise AmbiguousFailure("HTTP 503", status_code=503)
        if result == "429":
            raise TransientFailure("HTTP 429", status_code=429)
        if result == "409":
            raise AmbiguousFailure("HTTP 409: in progress for this key", status_code=409)
        raise PermanentFailure("HTTP 400", status_code=400)

    async def _serve(self, request: Request, answer: asyncio.Future[str]) -> None:
        loop = asyncio.get_running_loop()
        try:
            if request.effect_at is not None:
                await asyncio.sleep(request.effect_at - loop.time())
                self._apply(request)
            wait = min(request.answer_at, request.sent_at + self.timeout + 0.001)
            await asyncio.sleep(max(0.0, wait - loop.time()))
            if not answer.done():
                answer.set_result(request.outcome)
        finally:
            self.truth.in_flight -= 1
            current = asyncio.current_task()
            if current is not None:
                self._serving.discard(current)

    def _apply(self, request: Request) -> None:
        key = request.key
        times = self.truth.effects.setdefault(key, [])
        duplicate = self.idempotent and bool(times)
        times.append((request.effect_at or 0.0, not duplicate))
        if not duplicate:
            self.truth.received[key] += 1
        self._ids.setdefault(key, f"m{len(self._ids) + 1}")
        self.trace.add(
            f"provider_effect req={self.trace.rid(request.request_id)} "
            f"received={self.truth.received[key]}{' (deduplicated)' if duplicate else ''}"
        )

    async def lookup(self, idempotency_key: str) -> Sent | None:
        """Whether an effect is visible yet (``lookup_lag`` after it happened)."""
        loop = asyncio.get_running_loop()
        n = self._lookups[idempotency_key]
        self._lookups[idempotency_key] += 1
        rng = random.Random(f"lookup:{self.seed}:{idempotency_key}:{n}")
        await asyncio.sleep(rng.uniform(0.01, 0.3))
        now = loop.time()
        if rng.random() < 0.1:
            self.trace.add("provider_lookup result=error")
            raise AmbiguousFailure("lookup: HTTP 503", status_code=503)
        effects = self.truth.effects.get(idempotency_key, [])
        seen = [t for t, _ in effects if t + self.lookup_lag <= now]
        self.trace.add(f"provider_lookup result={'found' if seen else 'not_found'}")
        if not seen:
            return None
        return Sent(provider_message_id=self._ids.get(idempotency_key))

    async def aclose(self) -> None:
        return None


def _events_of(payload: object) -> tuple[str, ...] | None:
    """A digest payload's event ids (``events``), or None for any other payload."""
    events = payload.get("events") if isinstance(payload, dict) else None
    return tuple(str(e) for e in events) if isinstance(events, list) else None
