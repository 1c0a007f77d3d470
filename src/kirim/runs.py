"""Workflow runs: one per (type, event, recipient) of a type with ``steps``
(docs/workflows.md).

A run walks its type's steps (``kirim.notify.steps``, kept in the run as they were
when the event was recorded) one at a time, under a worker's claim (a lease and a
fencing token, as a job's): each step's outcome is recorded once (``RunStep``, one
row per run and step index, written only by the claim's holder), so a retried event
or a retried step creates nothing twice, and a branch is decided once.

A run's status moves only along ``EDGES`` (the store checks every change it writes):
``waiting`` (for its next step, due at ``next_at``) to ``done`` (the worker, past its
last step or at a false branch without ``else``) or ``canceled`` (an operator, or a
``cancel_on`` event); ``done`` to ``canceled`` when a delivery of its last steps had
not gone yet and the cancellation stopped it.

``decide`` is the one rule of a branch: the condition on an earlier step's delivery
(its status, doubt, and for the inbox its feed row's read and seen marks) or on the
event's data, and what a step not settled, or in doubt, makes of it.
"""

from __future__ import annotations

import enum
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kirim import day_time
from kirim.model import DeliveryStatus, Doubt
from kirim.notify.steps import Branch, Delay, Digest, Step
from kirim.views import iso

log = logging.getLogger("kirim.runs")


class RunStatus(enum.StrEnum):
    WAITING = "waiting"
    DONE = "done"
    CANCELED = "canceled"


class StepOutcome(enum.StrEnum):
    """What became of one step of a run."""

    SENT = "sent"  # its delivery was made (what became of it: the delivery's status)
    WAITED = "waited"  # a delay: the run waited until ``until``
    THEN = "then"  # a branch's condition held: the run went on
    ELSE = "else"  # it did not: the run skipped to ``else`` (or ended)
    SKIPPED = "skipped"  # passed over by a branch
    GATHERED = "gathered"  # a digest step: this run holds its window's events, goes on
    JOINED = "joined"  # a digest step: gathered into another run's digest, ends done


#: (source, target, who) of every change of a run's status
EDGES: tuple[tuple[RunStatus, RunStatus, str], ...] = (
    (RunStatus.WAITING, RunStatus.DONE, "worker"),
    (RunStatus.WAITING, RunStatus.CANCELED, "operator, cancel_on event"),
    # every step taken, but a delivery of its last steps had not gone: it is canceled
    (RunStatus.DONE, RunStatus.CANCELED, "operator, cancel_on event"),
)


def is_edge(source: RunStatus, target: RunStatus) -> bool:
    return source is target or any(s is source and t is target for s, t, _ in EDGES)


def check(run_id: int, source: str, target: str, where: str) -> bool:
    """Log an error when a written change of a run's status is not an edge."""
    if is_edge(RunStatus(source), RunStatus(target)):
        return True
    log.error(
        "unknown_run_edge",
        extra={"run_id": run_id, "source": source, "target": target, "where": where},
    )
    return False


def _part(text: str) -> str:
    return text.replace("%", "%25").replace(":", "%3A")


def cancel_value(data: Mapping[str, Any], key: str | None) -> str | None:
    """The value ``data`` gives a type's ``cancel_key``: its runs keep it, and an event
    of its ``cancel_on`` cancels those whose value it gives too (None: no value)."""
    if key is None:
        return None
    value = data.get(key)
    return None if value is None else str(value)


def run_key(type: str, event_id: str, recipient_id: str) -> str:
    """A run's key: sha256 of ``run:{type}:{event_id}:{recipient_id}``."""
    text = f"run:{_part(type)}:{_part(event_id)}:{_part(recipient_id)}"
    return hashlib.sha256(text.encode()).hexdigest()


def digest_stream(type: str, recipient_id: str, value: str) -> str:
    """A digest step's stream: sha256 of ``rundigest:{type}:{recipient}:{value}``
    (``value``: the event's data at the step's key, empty for ``"recipient"``, with the
    run's cancellation value beside it when it has one: ``store.run_digests._value``)."""
    text = f"rundigest:{_part(type)}:{_part(recipient_id)}:{_part(value)}"
    return hashlib.sha256(text.encode()).hexdigest()


#: A gathered run's later send, rendered when it is made: (the run, the channel, its
#: message as the event's record rendered it: ``recipient``, ``payload``, ``locale``,
#: the window's events, oldest first: ``{"run_id", "event_id", "data"}``) -> the
#: payload's JSON text; None: this worker does not know the run's type. What it raises
#: is the render's failure (the step is then recorded ``skipped``, with why).
RenderGathered = Callable[["Run", str, Mapping[str, str], Sequence[Mapping[str, Any]]], str | None]


def step_key(key: str, index: int, channel: str) -> str:
    """The idempotency key of the delivery of step ``index`` of the run ``key``."""
    return hashlib.sha256(f"{key}:step:{index}:{_part(channel)}".encode()).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStep:
    """One recorded step of a run."""

    index: int
    outcome: StepOutcome
    why: str
    at: float
    delivery_id: int | None = None
    until: float | None = None
    #: the step's delivery as it is now (``Store.get_run``): its status and doubt
    delivery_status: DeliveryStatus | None = None
    delivery_doubt: Doubt | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    id: int
    key: str
    type: str
    event_id: str
    recipient_id: str
    status: RunStatus
    #: the index of the next step to take
    cursor: int
    #: when the next step is due (store time); None once the run is over
    next_at: float | None
    steps: tuple[Step, ...]
    data: Mapping[str, Any]
    cancel_value: str | None
    why: str | None
    created_at: float
    updated_at: float
    claim_token: str | None = None
    claimed_by: str | None = None
    claim_expires_at: float | None = None
    recorded: tuple[RunStep, ...] = field(default=())
    #: why this kirim cannot read the run's steps (a newer kirim's kind or shape, in a
    #: rolling upgrade; ``steps`` is then empty and ``stored_steps`` holds them as
    #: written): an operator's reads show it, a worker leaves the run to a newer one
    unreadable: str | None = None
    stored_steps: tuple[Mapping[str, Any], ...] = field(default=())

    @property
    def over(self) -> bool:
        return self.status is not RunStatus.WAITING


@dataclass(frozen=True, slots=True, kw_only=True)
class RunClaim:
    """A run claimed by a worker: its token fences what the worker records."""

    run: Run
    token: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StepState:
    """What a branch reads of an earlier send step: its delivery, if it was made."""

    status: DeliveryStatus | None
    doubt: Doubt | None = None
    #: the inbox: whether its message is in the feed, read, seen
    in_feed: bool = False
    read: bool = False
    seen: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """A branch's decision: ``taken`` True (then), False (else), None (wait: the step
    is not settled yet), and why, in words the timeline shows."""

    taken: bool | None
    why: str


_SETTLING = (DeliveryStatus.PENDING, DeliveryStatus.PROCESSING)


def in_doubt(state: StepState) -> bool:
    return state.status is DeliveryStatus.IN_DOUBT or state.doubt in (
        Doubt.HELD,
        Doubt.ASSUMED_SENT,
    )


def decide(branch: Branch, data: Mapping[str, Any], state: StepState | None) -> Decision:
    """The decision of ``branch`` (``state``: its step's, None for ``data``)."""
    if branch.condition == "data":
        value = data.get(branch.field or "")
        held = value == branch.equals
        return Decision(held, f"data {branch.field} is {value!r}, condition {branch.equals!r}")
    assert state is not None
    if state.status is None:
        return Decision(False, f"step {branch.step} made no delivery")
    what = f"step {branch.step} is {state.status}"
    if state.status in _SETTLING:
        return Decision(None, f"{what}: waits for it to settle")
    if branch.condition == "in_doubt":
        return Decision(in_doubt(state), what + (" in doubt" if in_doubt(state) else ""))
    if in_doubt(state):
        if branch.on_doubt == "wait":
            return Decision(None, f"{what}, in doubt: waits (on_doubt = wait)")
        return Decision(
            branch.on_doubt == "then", f"{what}, in doubt: on_doubt = {branch.on_doubt}"
        )
    held = _holds(branch.condition, state)
    if branch.condition in ("read", "unread", "seen", "unseen"):
        marks = "read" if state.read else ("seen, not read" if state.seen else "not seen")
        what += f", {marks}" if state.in_feed else ", not in the feed"
    return Decision(held, what)


def _holds(condition: str, state: StepState) -> bool:
    s = state.status
    return {
        "sent": s in (DeliveryStatus.SENT, DeliveryStatus.DELIVERED),
        "delivered": s is DeliveryStatus.DELIVERED,
        "failed": s in (DeliveryStatus.FAILED, DeliveryStatus.BOUNCED),
        "suppressed": s in (DeliveryStatus.SUPPRESSED, DeliveryStatus.CANCELED),
        "read": state.read,
        "unread": not state.read,
        "seen": state.seen,
        "unseen": not state.seen,
    }[condition]


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRun:
    """What an event of a workflow type did for one recipient."""

    recipient_id: str
    run_id: int
    key: str
    created: bool
    status: RunStatus

    def to_json(self) -> dict[str, Any]:
        return {
            "recipient_id": self.recipient_id,
            "run_id": self.run_id,
            "key": self.key,
            "created": self.created,
            "status": str(self.status),
        }


# -- the operator's view: a run as its steps on one timeline ------------------------------


def timeline(run: Run) -> list[dict[str, Any]]:
    """Each step of ``run``, in order: ``state`` (what it did, or ``waits``, ``next``,
    ``to come``, ``canceled``), when, and why (a digest step's outcome also as
    ``summary``: ``gathered (3 events)``, ``joined run 12``) (``kirim run show``, the dashboard); an
    until-delay's end also as the recipient's clock read it (``local_until``:
    ``2026-12-03 09:00 CET (Europe/Berlin)``)."""
    done = {s.index: s for s in run.recorded}
    if run.unreadable is not None:
        return _unreadable_timeline(run, done)
    out = []
    for i, step in enumerate(run.steps):
        entry: dict[str, Any] = {"index": i, **step.to_json()}
        r = done.get(i)
        if r is not None:
            waits = (
                r.outcome is StepOutcome.WAITED
                and run.status is RunStatus.WAITING
                and run.cursor == i + 1
            )
            entry.update(
                state="waits" if waits else str(r.outcome),
                at=iso(r.at),
                until=iso(r.until),
                why=r.why,
                delivery_id=r.delivery_id,
                delivery_status=None if r.delivery_status is None else str(r.delivery_status),
                doubt=None if r.delivery_doubt is None else str(r.delivery_doubt),
            )
            if r.outcome is StepOutcome.GATHERED:
                entry["summary"] = f"gathered ({r.why})"
            elif r.outcome is StepOutcome.JOINED:
                entry["summary"] = f"joined {r.why}"
            if isinstance(step, Delay) and step.until is not None and r.until is not None:
                zone = day_time.zone_in(r.why) or day_time.zone_of(None, step.zone)
                entry["local_until"] = f"{day_time.local_text(r.until, zone)} ({zone})"
        elif run.status is RunStatus.WAITING and i == run.cursor and isinstance(step, Digest):
            why = run.why or "in a digest window"
            entry.update(state="waits", until=iso(run.next_at), why=why)
        elif run.status is RunStatus.WAITING and i == run.cursor:
            entry.update(state="next", until=iso(run.next_at), why="due then")
        elif run.status is RunStatus.CANCELED:
            entry.update(state="canceled", why=run.why)
        else:
            entry.update(state="to come")
        out.append(entry)
    return out


def _unreadable_timeline(run: Run, done: Mapping[int, RunStep]) -> list[dict[str, Any]]:
    """The steps of a run this kirim cannot read, as stored: each recorded one with
    its outcome, the others ``unreadable`` (why: ``run.unreadable``)."""
    out = []
    for i, raw in enumerate(run.stored_steps):
        entry: dict[str, Any] = {"index": i, **raw, "kind": str(raw.get("kind", "?"))}
        r = done.get(i)
        if r is not None:
            entry.update(state=str(r.outcome), at=iso(r.at), why=r.why, delivery_id=r.delivery_id)
        else:
            entry.update(state="unreadable", why=run.unreadable)
        out.append(entry)
    return out


def run_json(run: Run) -> dict[str, Any]:
    """A run as one JSON object: the CLI's, the API's and the dashboard's."""
    return {
        "id": run.id,
        "key": run.key,
        "type": run.type,
        "event_id": run.event_id,
        "recipient_id": run.recipient_id,
        "status": str(run.status),
        "why": run.why,
        "next_at": iso(run.next_at),
        "claimed_by": run.claimed_by,
        "created_at": iso(run.created_at),
        "updated_at": iso(run.updated_at),
        "unreadable": run.unreadable,
        "steps": timeline(run),
    }


__all__ = [
    "Decision",
    "EventRun",
    "RenderGathered",
    "Run",
    "RunClaim",
    "RunStatus",
    "RunStep",
    "StepOutcome",
    "StepState",
    "cancel_value",
    "decide",
    "digest_stream",
    "run_json",
    "run_key",
    "step_key",
    "timeline",
]
