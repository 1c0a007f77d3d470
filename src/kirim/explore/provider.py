"""The provider model: a remote service on its own host, and the ground truth.

``send`` registers the request the moment it is called (the request left), then
a task on the provider's host applies the effect after an *effect delay* and
answers after a *response delay*. A worker that crashes meanwhile does not stop
the request: it lands anyway. An answer later than ``timeout`` reaches the caller
as ``AmbiguousFailure("timeout")`` at ``timeout``, as an HTTP client's would.

Outcomes (``kirim.chaos.Fate``, the vocabulary simulate and the demo share), drawn
per request from the seed, the key and the request's number (so that a schedule
change does not redraw the other requests):

=================  =========================================  ===========
outcome            the caller gets                             user gets it
=================  =========================================  ===========
``accepted``       ``Sent``                                    yes
``accepted_lost``  ``AmbiguousFailure`` (the answer was lost)  yes
``refused``        ``TransientFailure`` (connection refused)   no
``5xx``            ``AmbiguousFailure`` (503, not processed)   no
``429``            ``TransientFailure`` (429)                  no
``400``            ``PermanentFailure`` (400)                  no
``dead``           ``DeadAddress`` (410: an address in dead)   no
=================  =========================================  ===========

A ``collapse`` model keeps no key on its server (every request is a message), but
the device replaces a notification it still shows (``collapse_window`` seconds after
it showed it) by a message of the same key: the user's count (``received``, the
``counted`` effects) is what the device shows.

A model made for a channel of a ``full`` schedule (``kirim.explore.world``) also has
a ``name`` (its requests, copies and callbacks say which provider they reached), a
``dedup_window`` (an idempotent provider forgets a key that long after it first
acted on it: a request after that is a new message), answers whose meaning the
channel's failure classes describe (``meaning_503``: an HTTP 503 that may have acted,
never does, or refuses for good; ``meaning_400``: a 400 that may have acted), a share
of accepted messages that ``bounce`` (the provider had it, the user did not get it),
and delivery callbacks (``post``): one per message, early (before the worker can have
recorded the answer), soon or late, sometimes twice, carrying the key or not.

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
from typing import Any

from kirim.chaos import ACTED, Fate
from kirim.errors import AmbiguousFailure, DeadAddress, TransientFailure
from kirim.explore.loop import HOST, Host, host_context
from kirim.explore.trace import Trace
from kirim.providers.base import Message, Sent
from kirim.providers.webhook import default_class, status_classes

OUTCOMES = (
    (Fate.ACCEPTED.value, 46),
    (Fate.ACCEPTED_LOST.value, 12),
    (Fate.REFUSED.value, 10),
    (Fate.UNAVAILABLE.value, 10),
    (Fate.THROTTLED.value, 14),
    (Fate.REJECTED.value, 8),
)
#: the outcomes of a ``full`` schedule's provider (``503``/``400``: what their meaning
#: allows; ``*_acted``: answered so, after acting on the request)
FULL_OUTCOMES = (
    (Fate.ACCEPTED.value, 46),
    (Fate.ACCEPTED_LOST.value, 12),
    (Fate.REFUSED.value, 10),
    (Fate.STATUS_503.value, 10),
    (Fate.THROTTLED.value, 14),
    (Fate.REJECTED.value, 8),
)
EFFECT = frozenset(fate.value for fate in ACTED)
#: the HTTP status each outcome answers with (classified as the webhook provider does)
STATUS = {
    Fate.STATUS_503.value: 503,
    Fate.ACTED_503.value: 503,
    Fate.UNAVAILABLE.value: 503,
    Fate.THROTTLED.value: 429,
    Fate.REJECTED.value: 400,
    Fate.ACTED_400.value: 400,
}


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
    #: the provider (channel) that got it ("" in the one-channel workloads)
    provider: str = ""
    #: the address it went to (the delivery's recipient)
    recipient: str = ""


@dataclass(slots=True)
class Copy:
    """One message the provider made of a request: ``fate`` ``delivered`` (the user got
    it) or ``bounced`` (did not); ``counted`` False: a key the provider deduplicated."""

    key: str
    provider: str
    request_id: str
    message_id: str
    at: float
    fate: str
    counted: bool


@dataclass(slots=True)
class CallbackRecord:
    """One callback the provider posted, and kirim's answer to it."""

    copy: Copy
    status: str
    key: str | None
    sent_at: float
    answered_at: float | None = None
    outcome: str = ""
    delivery_id: int | None = None
    result_status: str | None = None
    duplicate: bool = False


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
    #: the full workload: every message made, and every callback posted
    copies: list[Copy] = field(default_factory=list)
    callbacks: list[CallbackRecord] = field(default_factory=list)
    #: (provider, address) -> virtual time the provider first answered it is dead
    dead_answers: dict[tuple[str, str], float] = field(default_factory=dict)

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
        timeout: float | None,
        lookup_lag: float = 2.0,
        name: str = "",
        dedup_window: float | None = None,
        bounce: float = 0.0,
        meaning_503: str | None = None,
        meaning_400: str = "permanent",
        classes: dict[str, list[int]] | None = None,
        horizon: float | None = None,
        horizons: dict[str, float] | None = None,
        post: Any = None,
        callback_key: bool = False,
        callback_host: Host | None = None,
        collapse: bool = False,
        collapse_window: float | None = None,
        dead: frozenset[str] = frozenset(),
        address_kind: str | None = None,
    ) -> None:
        """``timeout``: the client's own (None: the worker cuts the call off at its
        ``request_timeout``; ``horizon`` is then how long answers may take, and
        ``horizons`` the request timeout of each worker by its host's label: a request
        acts within its own sender's timeout, which kirim's settled attempts assume).
        ``meaning_503`` None: the one-channel model (a 503 never acts, and is
        ambiguous). ``post``: ``async post(CallbackRecord)``, kirim's callback
        endpoint (None: no callbacks). ``collapse``: the device replaces a notification
        it shows (for ``collapse_window`` seconds) by a resend of its key, though the
        server keeps no key (kirim sees the provider as idempotent); ``dead``: the
        addresses the provider answers ``DeadAddress`` for."""
        self.idempotent = idempotent or collapse
        #: the server deduplicates by key (else only the device may, by collapse)
        self._dedup = idempotent
        self.collapse = collapse
        self.collapse_window = collapse_window
        self.dead = dead
        #: the kind of address the channel takes (``kirim.addresses``)
        self.address_kind = address_kind
        #: key -> when the device began to show it (collapse)
        self._shown_at: dict[str, float] = {}
        self.timeout = timeout
        self.name = name
        self.dedup_window = dedup_window
        self.bounce = bounce
        self.meaning_503 = meaning_503
        self.meaning_400 = meaning_400
        self._classes = status_classes(**(classes or {}))
        self.horizon = float(timeout if timeout is not None else (horizon or 25.0))
        self._horizons = {} if timeout is not None else dict(horizons or {})
        self.post = post
        self.callback_key = callback_key
        self._callback_context = host_context(callback_host) if callback_host else None
        #: key -> (time the provider first acted on it, its message id), while remembered
        self._remembered: dict[str, tuple[float, str]] = {}
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
        self._copies = 0
        self._serving: set[asyncio.Task[None]] = set()

    def _draw(
        self, key: str, now: float, recipient: str = "", caller: str = ""
    ) -> tuple[str, float | None, float]:
        horizon = self._horizons.get(caller, self.horizon)
        n = self._sent[key]
        self._sent[key] += 1
        rng = random.Random(f"provider:{self.seed}:{self.name}{key}:{n}")
        table = OUTCOMES if self.meaning_503 is None else FULL_OUTCOMES
        outcome = rng.choices([o for o, _ in table], [w for _, w in table])[0]
        if outcome == Fate.STATUS_503 and self.meaning_503 == "ambiguous" and rng.random() < 0.5:
            outcome = Fate.ACTED_503.value
        if outcome == Fate.REJECTED and self.meaning_400 == "ambiguous" and rng.random() < 0.4:
            outcome = Fate.ACTED_400.value
        if recipient in self.dead:
            outcome = Fate.DEAD.value
        elif self._dedup:
            # A provider that honours keys answers a known key as it did the first
            # time (a replayed success), and one still being processed with 409.
            earlier = [
                r.effect_at for r in self.truth.requests if r.key == key and r.provider == self.name
            ]
            landed = [t for t in earlier if t is not None]
            if self._knows(key, now):
                outcome = Fate.ACCEPTED.value
            elif any(t > now for t in landed):
                outcome = Fate.IN_PROGRESS.value
        slow = outcome != Fate.REFUSED and rng.random() < 0.25
        if slow:
            first = rng.uniform(0.3 * self.lease, 0.95 * horizon)
            answer = first + rng.uniform(0.0, 0.6 * horizon)
        else:
            first = rng.uniform(0.01, 0.5)
            answer = first + rng.uniform(0.01, 0.3)
        effect = now + first if outcome in EFFECT else None
        if outcome not in EFFECT:
            answer = first  # a definite failure is known when it is answered
        return outcome, effect, now + answer

    def _knows(self, key: str, at: float) -> bool:
        """Whether the provider remembers ``key`` at ``at`` (it acted on it, within its
        dedup window)."""
        known = self._remembered.get(key)
        if known is None or known[0] > at:
            return False
        return self.dedup_window is None or at < known[0] + self.dedup_window

    async def send(self, message: Message) -> Sent:
        loop = asyncio.get_running_loop()
        now = loop.time()
        current = HOST.get()
        caller = "-" if current is None else current.label
        # by the host's name: a restarted process (``C#2``) runs the same worker settings
        outcome, effect_at, answer_at = self._draw(
            message.idempotency_key,
            now,
            message.recipient,
            "-" if current is None else current.name,
        )
        request = Request(
            key=message.idempotency_key,
            request_id=message.provider_request_id,
            caller=caller,
            sent_at=now,
            outcome=outcome,
            effect_at=effect_at,
            answer_at=answer_at,
            events=_events_of(message.payload),
            provider=self.name,
            recipient=message.recipient,
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
        except asyncio.CancelledError:
            request.answer = "cut"  # the worker's request timeout (or its shutdown)
            raise
        request.answer = result
        if result == Fate.ACCEPTED:
            return Sent(provider_message_id=self._ids.get(request.request_id))
        if result == Fate.ACCEPTED_LOST:
            raise AmbiguousFailure("connection reset after the request was written")
        if result == Fate.REFUSED:
            raise TransientFailure("connection refused")
        if result == Fate.UNAVAILABLE:
            raise AmbiguousFailure("HTTP 503", status_code=503)
        if result == Fate.DEAD:
            self.truth.dead_answers.setdefault((self.name, message.recipient), loop.time())
            raise DeadAddress("HTTP 410: Unregistered", address=message.recipient, status_code=410)
        if result == Fate.IN_PROGRESS:
            raise AmbiguousFailure("HTTP 409: in progress for this key", status_code=409)
        code = STATUS[result]
        kind = self._classes.get(code) or default_class(code)
        raise kind(f"HTTP {code}", status_code=code)

    async def _serve(self, request: Request, answer: asyncio.Future[str]) -> None:
        loop = asyncio.get_running_loop()
        try:
            if request.effect_at is not None:
                await asyncio.sleep(request.effect_at - loop.time())
                self._apply(request)
            wait = min(request.answer_at, request.sent_at + self.horizon + 0.001)
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
        at = request.effect_at or 0.0
        times = self.truth.effects.setdefault(key, [])
        duplicate = self._dedup and self._knows(key, at)
        if duplicate:
            message_id = self._remembered[key][1]
        else:
            self._copies += 1
            message_id = f"{self.name}m{self._copies}" if self.name else f"m{self._copies}"
            if self._dedup:
                self._remembered[key] = (at, message_id)
        self._ids[request.request_id] = message_id
        # drawn from the key and the copy's number (request ids are random per run)
        made = sum(1 for c in self.truth.copies if c.key == key and c.provider == self.name)
        rng = random.Random(f"fate:{self.seed}:{self.name}:{key}:{made}")
        fate = "bounced" if not duplicate and rng.random() < self.bounce else "delivered"
        replaced = not duplicate and self._showing(key, at)  # the device shows it once
        counted = not duplicate and not replaced and fate == "delivered"
        if counted and self.collapse:
            self._shown_at[key] = at
        times.append((at, counted))
        if counted:
            self.truth.received[key] += 1
        copy = Copy(
            key=key,
            provider=self.name,
            request_id=request.request_id,
            message_id=message_id,
            at=at,
            fate=fate,
            counted=not duplicate,
        )
        if not duplicate:
            self.truth.copies.append(copy)
            self._callbacks(copy, rng)
        said = " (deduplicated)" if duplicate else (" (bounced)" if fate == "bounced" else "")
        said = " (replaced on the device)" if replaced and fate == "delivered" else said
        self.trace.add(
            f"provider_effect req={self.trace.rid(request.request_id)} "
            f"received={self.truth.received[key]}{said}"
        )

    def _showing(self, key: str, at: float) -> bool:
        """Whether the device shows a notification of ``key`` at ``at`` (collapse: a
        resend replaces it)."""
        shown = self._shown_at.get(key)
        if not self.collapse or shown is None:
            return False
        return self.collapse_window is None or at < shown + self.collapse_window

    def _callbacks(self, copy: Copy, rng: random.Random) -> None:
        """Post the copy's callback (early, soon or late; sometimes twice)."""
        if self.post is None:
            return
        loop = asyncio.get_running_loop()
        when = rng.choice(("early", "soon", "soon", "late"))
        delay = {"early": rng.uniform(0.01, 0.3), "soon": rng.uniform(0.5, 10.0)}.get(
            when, rng.uniform(20.0, 90.0)
        )
        times = [delay] + ([delay + rng.uniform(0.0, 30.0)] if rng.random() < 0.2 else [])
        for wait in times:
            record = CallbackRecord(
                copy=copy,
                status=copy.fate,
                key=copy.key if self.callback_key else None,
                sent_at=copy.at + wait,
            )
            self.truth.in_flight += 1
            task = loop.create_task(self._post(record, wait), context=self._callback_context)
            self._serving.add(task)

    async def _post(self, record: CallbackRecord, wait: float) -> None:
        try:
            await asyncio.sleep(wait)
            await self.post(record)
        finally:
            self.truth.in_flight -= 1
            current = asyncio.current_task()
            if current is not None:
                self._serving.discard(current)

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
        mine = [
            r
            for r in self.truth.requests
            if r.key == idempotency_key and r.provider == self.name and r.effect_at is not None
        ]
        seen = [r for r in mine if r.effect_at is not None and r.effect_at + self.lookup_lag <= now]
        self.trace.add(f"provider_lookup result={'found' if seen else 'not_found'}")
        if not seen:
            return None
        return Sent(provider_message_id=self._ids.get(seen[0].request_id))

    async def aclose(self) -> None:
        return None


def _events_of(payload: object) -> tuple[str, ...] | None:
    """A digest payload's event ids (``events``), or None for any other payload."""
    events = payload.get("events") if isinstance(payload, dict) else None
    return tuple(str(e) for e in events) if isinstance(events, list) else None
