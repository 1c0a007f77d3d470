"""Faults: a plan drawn per seed, and the store wrapper that injects store faults.

A plan is a list of ``Fault`` (plain data, saved in a failure file and shrunk by
dropping entries). Kinds:

- ``skew``: the host's clock runs ``offset`` seconds off, at ``rate``;
- ``crash``: SIGKILL at ``at`` (restarted, as a new process, at the heal time);
- ``stall``: SIGSTOP at ``at`` for ``duration`` seconds (longer than the lease);
- ``shutdown``: graceful ``worker.stop()`` at ``at`` (restarted at the heal time);
- ``store``: the host's ``nth`` call of ``method`` after ``at`` fails before it
  commits (``mode=fail``) or commits and then raises (``mode=ack_lost``); the
  events workload adds some on ``seal_digest`` and ``claim`` (``draw_event_faults``);
- ``poison``: every batch with ``delivery`` in it fails inside the transaction
  (rolled back) from ``at`` until the heal time;
- ``pause``: SIGSTOP for ``duration`` seconds when the host's worker reaches its
  ``nth`` checkpoint ``method`` (``after_claim``, ``before_provider_request``, …);
- ``cancel``: the operator cancels ``delivery`` at ``at``;
- ``retry``: the operator retries every dead letter (failed or held) at ``at``,
  and again every 3 s for ``duration`` seconds (an operator working the queue);
- ``takeover``: SIGSTOP when the host's worker reaches its ``nth`` ``before_commit``
  (the provider's answer in hand) until another worker claims that delivery, at
  most ``duration`` seconds; the claimant is held while the stale finish lands
  (``kirim.explore.takeover``; the full workload, ``draw_takeovers``).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, get_args

from kirim.errors import StoreError
from kirim.worker.checkpoint import CHECKPOINTS

#: what a fault does (see the module docstring)
FaultKind = Literal[
    "skew", "crash", "stall", "pause", "shutdown", "store", "poison", "cancel", "retry", "takeover"
]
#: kinds with no time of their own to fire or heal at: a skew lasts the whole run, the
#: others are set off by a worker's checkpoint
UNTIMED = ("skew", "pause", "takeover")
KINDS: tuple[FaultKind, ...] = get_args(FaultKind)
#: how a ``store`` fault fails its call: before the commit, or after it (the answer is
#: lost); "" for the other kinds
StoreMode = Literal["fail", "ack_lost", ""]
STORE_METHODS = ("claim", "record_intents", "finish", "heartbeat", "reap", "release")
#: store methods of the notification layer, faulted in the events workload only
EVENT_STORE_METHODS = ("seal_digest", "claim")
#: store methods of the features the full workload adds, faulted there only
FULL_STORE_METHODS = ("take_rate_slot", "apply_kept_callbacks", "prune", "heartbeat", "not_found")
#: batch methods whose items carry a delivery_id (what a poisoned row breaks)
BATCHES = ("record_intents", "finish")


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    kind: FaultKind
    at: float = 0.0
    host: str = ""
    duration: float = 0.0
    offset: float = 0.0
    rate: float = 1.0
    method: str = ""
    nth: int = 1
    mode: StoreMode = ""
    delivery: int = 0

    def describe(self) -> str:
        shown = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "kind" and getattr(self, f.name) != f.default
        }
        text = " ".join(
            f"{k}={round(v, 3) if isinstance(v, float) else v}" for k, v in shown.items()
        )
        return f"{self.kind} {text}".strip()

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v != getattr(_DEFAULT, k) or k == "kind"}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Fault:
        return Fault(**data)


_DEFAULT = Fault(kind="skew")


def draw_plan(seed: int, *, hosts: Sequence[str], deliveries: int, lease: float) -> list[Fault]:
    """The faults of one seed: clock skew on some hosts, then up to four others."""
    rng = random.Random(f"plan:{seed}")
    plan: list[Fault] = []
    for host in hosts:
        if rng.random() < 0.5:
            offset = rng.uniform(-1.5 * lease, 1.5 * lease)
            plan.append(Fault(kind="skew", host=host, offset=offset, rate=rng.uniform(0.98, 1.02)))
    for _ in range(rng.choice((0, 1, 1, 2, 2, 3, 4))):
        kind: FaultKind = rng.choice(
            ("crash", "stall", "pause", "pause", "shutdown", "store", "poison", "cancel", "retry")
        )
        at = rng.uniform(0.0, 30.0)
        host = rng.choice(list(hosts))
        delivery = rng.randint(1, deliveries)
        if kind in ("crash", "shutdown"):
            plan.append(Fault(kind=kind, host=host, at=at))
        elif kind == "stall":
            plan.append(Fault(kind=kind, host=host, at=at, duration=rng.uniform(lease, 3 * lease)))
        elif kind == "pause":
            plan.append(
                Fault(
                    kind=kind,
                    host=host,
                    method=rng.choice(CHECKPOINTS),
                    nth=rng.randint(1, 3),
                    duration=rng.uniform(lease, 3 * lease),
                )
            )
        elif kind == "store":
            method = rng.choice(STORE_METHODS)
            mode: StoreMode = rng.choice(("fail", "ack_lost"))
            plan.append(
                Fault(kind=kind, host=host, at=at, method=method, nth=rng.randint(1, 4), mode=mode)
            )
        elif kind == "poison" or kind == "cancel":
            plan.append(Fault(kind=kind, at=at, delivery=delivery))
        else:
            plan.append(Fault(kind=kind, at=rng.uniform(10.0, 40.0), duration=15.0))
    return plan


def draw_event_faults(seed: int, *, hosts: Sequence[str]) -> list[Fault]:
    """Store faults for the events workload, drawn apart so that the plain workload's
    plans stay as they were: the digest seal (and the claim that re-checks
    preferences) failing before its commit, or committing and losing its answer."""
    rng = random.Random(f"plan-events:{seed}")
    plan: list[Fault] = []
    for _ in range(rng.choice((0, 0, 1, 1, 2))):
        mode: StoreMode = rng.choice(("fail", "ack_lost"))
        plan.append(
            Fault(
                kind="store",
                host=rng.choice(list(hosts)),
                at=rng.uniform(0.0, 30.0),
                method=rng.choice(EVENT_STORE_METHODS),
                nth=rng.randint(1, 3),
                mode=mode,
            )
        )
    return plan


def draw_short_pauses(seed: int, *, hosts: Sequence[str], lease: float) -> list[Fault]:
    """The full workload's own faults (drawn apart, so that the other workloads' plans
    stay as they were): pauses shorter than a claim's send window at a worker's
    checkpoints (a garbage collection or a busy host between an intent and its
    request, during which a callback, the reaper or an operator may act), and store
    faults on what its features add (a rate slot, kept callbacks, a prune, a renewal
    after a pause), failing before the commit or losing its answer after it."""
    rng = random.Random(f"plan-pauses:{seed}")
    plan = [
        Fault(
            kind="pause",
            host=rng.choice(list(hosts)),
            method=rng.choice(CHECKPOINTS),
            nth=rng.randint(1, 4),
            duration=rng.uniform(0.6, 0.5 * lease),
        )
        for _ in range(rng.choice((0, 0, 1, 2)))
    ]
    for _ in range(rng.choice((0, 1, 1, 2))):  # a commit whose answer is lost, or none
        mode: StoreMode = rng.choice(("fail", "ack_lost"))
        plan.append(
            Fault(
                kind="store",
                host=rng.choice(list(hosts)),
                at=rng.uniform(0.0, 40.0),
                method=rng.choice(FULL_STORE_METHODS),
                nth=rng.randint(1, 3),
                mode=mode,
            )
        )
    return plan


def draw_takeovers(seed: int, *, hosts: Sequence[str], lease: float) -> list[Fault]:
    """The full workload's forced takeovers (drawn apart, so that the other plans stay
    as they were): in about a third of the seeds one worker stops at a finish until
    another has claimed its delivery, for at most 4 to 6 leases (the lease to expire,
    the reaper to requeue, a poll to claim: the drawn leases are 6 to 15 s)."""
    rng = random.Random(f"plan-takeover:{seed}")
    if rng.random() >= 0.35:
        return []
    return [
        Fault(
            kind="takeover",
            host=rng.choice(list(hosts)),
            method="before_commit",
            nth=rng.randint(1, 3),
            duration=rng.uniform(4.0, 6.0) * lease,
        )
    ]


def heal_time(plan: Sequence[Fault], *, minimum: float = 30.0) -> float:
    """When crashed hosts restart, stalls are over and poison is lifted."""
    ends = [f.at + f.duration for f in plan if f.kind not in UNTIMED]
    return max([minimum, *ends]) + 1.0


class FaultyStore:
    """A store that fails as the plan says; everything else is the real store's."""

    def __init__(
        self,
        inner: Any,
        *,
        host: str,
        plan: Sequence[Fault],
        time: Callable[[], float],
        heal: float,
        on_intent: Callable[[str], None],
    ) -> None:
        self._inner = inner
        self._host = host
        self._time = time
        self._heal = heal
        self._on_intent = on_intent
        self._store_faults = [f for f in plan if f.kind == "store" and f.host == host]
        self._poison = [f for f in plan if f.kind == "poison"]
        self._calls: Counter[str] = Counter()
        self.fired: list[Fault] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _store_fault(self, method: str) -> Fault | None:
        now = self._time()
        for fault in self._store_faults:
            if fault.method == method and now >= fault.at and fault not in self.fired:
                self._calls[f"{method}:{fault.at}"] += 1
                if self._calls[f"{method}:{fault.at}"] == fault.nth:
                    self.fired.append(fault)
                    return fault
        return None

    def _poisoned(self, items: Sequence[Any]) -> bool:
        now = self._time()
        ids = {getattr(it, "delivery_id", None) for it in items}
        return any(f.at <= now < self._heal and f.delivery in ids for f in self._poison)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fault = self._store_fault(method)
        if fault is not None and fault.mode == "fail":
            raise StoreError(f"injected: {method} failed before commit")
        if method in BATCHES and args and self._poisoned(args[0]):
            raise StoreError(f"injected: a poisoned row made the {method} batch fail")
        result = await getattr(self._inner, method)(*args, **kwargs)
        if method == "record_intents":
            for intent, ok in zip(args[0], result, strict=True):
                if ok:
                    self._on_intent(intent.provider_request_id)
        if fault is not None:
            raise StoreError(f"injected: {method} committed, then the answer was lost")
        return result

    async def claim(self, **kwargs: Any) -> Any:
        return await self._call("claim", **kwargs)

    async def record_intents(self, intents: Sequence[Any]) -> Any:
        return await self._call("record_intents", intents)

    async def not_found(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("not_found", *args, **kwargs)

    async def finish(self, items: Sequence[Any]) -> Any:
        return await self._call("finish", items)

    async def heartbeat(self, leases: Sequence[Any], **kwargs: Any) -> Any:
        return await self._call("heartbeat", leases, **kwargs)

    async def reap(self, **kwargs: Any) -> Any:
        return await self._call("reap", **kwargs)

    async def release(self, leases: Sequence[Any], **kwargs: Any) -> Any:
        return await self._call("release", leases, **kwargs)

    async def seal_digest(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("seal_digest", *args, **kwargs)

    async def take_rate_slot(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("take_rate_slot", *args, **kwargs)

    async def apply_kept_callbacks(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("apply_kept_callbacks", *args, **kwargs)

    async def prune(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("prune", *args, **kwargs)

    async def expand_topic_batch(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("expand_topic_batch", *args, **kwargs)
