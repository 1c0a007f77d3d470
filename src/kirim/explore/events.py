"""The events workload: the driver records events of notification types and flips a
recipient's preferences, at seeded virtual times, while the workers run.

Two types on the explorer's channel: ``alert`` (plain) and ``digest`` (a digest of
``DIGEST_WINDOW`` virtual seconds per recipient). Each event goes to one to three of
the recipients; one event is given a second time later (same id, same data: it
makes nothing new). One recipient's preferences flip once, at a seeded time (out of
everything, or of one type on the channel), and in some seeds back again. Half the
flips land just after one of that recipient's events, so between its enqueue and
its claim; a digest waits for its window's end, so its flips land there often.

Every app and worker of the schedule gets the types (``Kirim(types=...)``, and the
workers the types' policies and digest composers, as ``Kirim.worker()`` gives them).
The driver writes what it did into the ground truth (``EventRecord``,
``FlipRecord``) for the invariants of ``invariants.py``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kirim.engine import Kirim
from kirim.explore.provider import EventRecord, FlipRecord, GroundTruth
from kirim.notify import NotificationType, composers, parse_type
from kirim.preferences import Preferences, TypePolicy
from kirim.store.base import Compose

CHANNEL = "push"
PLAIN = "alert"
DIGEST = "digest"
#: the digest's window, in virtual seconds
DIGEST_WINDOW = 5


def types() -> list[NotificationType]:
    """The workload's notification types, both on ``CHANNEL``."""
    return [
        parse_type(PLAIN, {"templates": {CHANNEL: {"title": "Alert {{ n }}"}}}),
        parse_type(
            DIGEST,
            {
                "templates": {CHANNEL: {"title": "{{ count }} updates"}},
                "digest": {"window": f"{DIGEST_WINDOW}s"},
            },
        ),
    ]


def policies(kinds: list[NotificationType]) -> dict[str, TypePolicy]:
    """What the workers check at claim (as ``Kirim.worker()`` passes them)."""
    return {t.name: t.policy for t in kinds}


def digests(kinds: list[NotificationType]) -> dict[str, Compose]:
    """What the workers seal digests with (as ``Kirim.worker()`` passes them)."""
    return composers({t.name: t for t in kinds})


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    at: float
    event_id: str
    type: str
    recipients: tuple[str, ...]
    n: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Flip:
    at: float
    recipient: str
    type: str | None  # None: opt out of everything
    off: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    events: tuple[Event, ...]
    flips: tuple[Flip, ...]


def draw(seed: int, *, events: int, spread: float) -> Workload:
    """The seed's events (``events`` of them, plus one given again) and flips; half the
    events come within a digest window after an earlier one."""
    rng = random.Random(f"events:{seed}")
    people = [f"u{i}" for i in range(1, rng.choice((2, 3, 3)) + 1)]
    made: list[Event] = []
    for i in range(1, events + 1):
        kind = rng.choice((DIGEST, DIGEST, PLAIN))
        chosen = tuple(sorted(rng.sample(people, rng.randint(1, len(people)))))
        if made and rng.random() < 0.5:  # close to an earlier one: a digest of several
            at = rng.choice(made).at + rng.uniform(0.0, DIGEST_WINDOW)
        else:
            at = rng.uniform(0.0, spread)
        made.append(Event(at=at, event_id=f"ev{i}", type=kind, recipients=chosen, n=i))
    again = rng.choice(made)
    made.append(
        Event(
            at=again.at + rng.uniform(0.5, 2.0 * DIGEST_WINDOW),
            event_id=again.event_id,
            type=again.type,
            recipients=again.recipients,
            n=again.n,
        )
    )
    made.sort(key=lambda e: (e.at, e.event_id))
    target = rng.choice(made)
    who = rng.choice(target.recipients)
    if rng.random() < 0.5:  # just after an event of the recipient: before its claim
        at = target.at + rng.uniform(0.0, 1.5)
    else:
        at = rng.uniform(0.0, spread + DIGEST_WINDOW)
    scope = rng.choice((None, PLAIN, DIGEST))
    flips = [Flip(at=at, recipient=who, type=scope, off=True)]
    if rng.random() < 0.3:
        flips.append(Flip(at=at + rng.uniform(1.0, 10.0), recipient=who, type=scope, off=False))
    return Workload(events=tuple(made), flips=tuple(flips))


def preferences(flip: Flip) -> Preferences:
    if flip.type is None:
        return Preferences(recipient_id=flip.recipient, opt_out=flip.off)
    choice = {f"{flip.type}:{CHANNEL}": not flip.off}
    return Preferences(recipient_id=flip.recipient, channels=choice)


async def drive(
    app: Kirim,
    workload: Workload,
    *,
    truth: GroundTruth,
    time: Callable[[], float],
    note: Callable[..., Any],
) -> None:
    """Record the events and make the flips, each at its virtual time, in time order."""
    steps: list[tuple[float, int, Event | Flip]] = [
        (e.at, i, e) for i, e in enumerate(workload.events)
    ]
    steps += [(f.at, len(steps) + i, f) for i, f in enumerate(workload.flips)]
    for at, _, step in sorted(steps, key=lambda s: (s[0], s[1])):
        await asyncio.sleep(max(0.0, at - time()))
        if isinstance(step, Flip):
            flipped = FlipRecord(
                recipient=step.recipient,
                type=step.type,
                channel=CHANNEL,
                off=step.off,
                started=time(),
            )
            truth.flips.append(flipped)
            await app.set_preferences(preferences(step))
            flipped.committed = time()
            scope = "everything" if step.type is None else f"{step.type}:{CHANNEL}"
            note(f"prefs {step.recipient} {scope}={'off' if step.off else 'on'}", host="S")
            continue
        started = time()
        result = await app.notify_event(
            step.type, list(step.recipients), {"n": step.n}, event_id=step.event_id
        )
        record = EventRecord(
            event_id=step.event_id, type=step.type, recipients=step.recipients, at=started
        )
        for d in result.deliveries:
            record.outcomes.append(
                (d.recipient_id, d.delivery_id, str(d.status), d.reason, d.digest)
            )
        truth.events.append(record)
        shown = " ".join(
            f"{d.recipient_id}:{d.delivery_id}:{d.status}{'' if d.created else '(again)'}"
            for d in result.deliveries
        )
        note(f"event {step.event_id} {step.type} {shown}", host="S")
