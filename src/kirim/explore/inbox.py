"""The in-app inbox in a ``full`` schedule: its ground truth and its invariant.

An inbox channel has no provider model: its message is a row of kirim's own
(``kirim_feed``), written in the commit that marks the delivery sent. What the user
got is therefore read from the database after the run: the feed audit
(``explore_feed_audit``, a trigger of ``hosts.AUDIT_SQL``) keeps every feed write,
inside the writing transaction, so a message that retention or the recipient
removed later still counts, and a write that was rolled back never does.

``feed_truth`` adds each write to the ground truth as a message the user got (so
``at_most_once``, ``certain_sent`` and ``certain_unsent`` judge inbox deliveries as any
other); ``feed_exactly_once`` is the inbox's own promise:

- no (recipient, key) was ever written twice, whatever crashed, stalled, timed out or
  lost its answer between the write and anything after it;
- a delivery whose request on an inbox channel succeeded (an attempt row says so,
  written in the same commit) has exactly one message, and one that has none such has
  no message;
- a delivery that ended ``sent`` on an inbox channel has its message, and none on an
  inbox channel is ever ``in_doubt``.

``check_feed_preferences`` holds the inbox to ``preferences_honoured`` as the other
channels are held through their requests: each message was written under a claim
taken while the recipient's preferences (certainly in force then) and the type's
window allowed it, so a message deferred by quiet hours is not in the feed before
the window.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kirim.explore.checks import claim_verdict, claims_of
from kirim.explore.full import FullTruth
from kirim.explore.invariants import Ledger, Violation
from kirim.explore.loop import WORKER_NAMES
from kirim.explore.provider import Copy, GroundTruth
from kirim.explore.world import World

NAME = "feed_exactly_once"


def _boxes(world: World) -> set[str]:
    return {c.name for c in world.channels if c.inbox}


def feed_truth(truth: GroundTruth, ledger: Ledger, world: World) -> None:
    """Each feed write, as a message its user got (virtual time: store time less the
    world's base)."""
    for w in ledger.feed_writes:
        key = str(w["idempotency_key"])
        at = float(w["created_at"]) - world.base
        truth.effects.setdefault(key, []).append((at, True))
        truth.received[key] += 1
        truth.copies.append(
            Copy(
                key=key,
                provider="inbox",
                request_id="",
                message_id=f"feed:{w['id']}",
                at=at,
                fate="delivered",
                counted=True,
            )
        )


def check_feed(ledger: Ledger, world: World) -> list[Violation]:
    """``feed_exactly_once`` (the module's text)."""
    boxes = _boxes(world)
    if not boxes and not ledger.feed_writes:
        return []
    writes = Counter(
        (str(w["recipient_id"]), str(w["idempotency_key"])) for w in ledger.feed_writes
    )
    per_key = Counter(str(w["idempotency_key"]) for w in ledger.feed_writes)
    out = [
        Violation(name=NAME, delivery=None, detail=f"{n} messages of key {key} for {rid}")
        for (rid, key), n in sorted(writes.items())
        if n > 1
    ]
    attempts: dict[int, list[dict[str, Any]]] = {}
    for a in ledger.attempts:
        attempts.setdefault(a["delivery_id"], []).append(a)
    for d in ledger.deliveries:
        mine = sorted(attempts.get(d["id"], []), key=lambda a: a["id"])
        to_box = [a for a in mine if (a.get("provider") or d["channel"]) in boxes]
        if not to_box:
            if per_key[d["idempotency_key"]]:
                out.append(_bad(d, "a feed message, though no request went to an inbox"))
            continue
        succeeded = any(a["status"] == "succeeded" for a in to_box)
        got = per_key[d["idempotency_key"]]
        if succeeded and got != 1:
            out.append(_bad(d, f"{got} feed messages, though its inbox request succeeded"))
        if not succeeded and got:
            out.append(_bad(d, f"{got} feed messages, though no inbox request succeeded"))
        last = mine[-1] if mine else None
        on_box = last is not None and (last.get("provider") or d["channel"]) in boxes
        if on_box and d["status"] in ("sent", "delivered") and got != 1:
            out.append(_bad(d, f"{d['status']} on an inbox channel with {got} feed messages"))
        if on_box and d["status"] == "in_doubt":
            out.append(_bad(d, "in doubt on an inbox channel, where nothing can be"))
    out += _doubted(ledger, world, attempts, boxes)
    return out


def _doubted(
    ledger: Ledger, world: World, attempts: dict[int, list[dict[str, Any]]], boxes: set[str]
) -> list[Violation]:
    """A claim that ended a delivery whose every request went to an inbox in doubt
    (held, or assumed sent): nothing was, nor can be, in doubt there (a request's effect
    is its commit, and a commit whose claim no longer holds writes nothing), even where
    a later answer set the record right (the release audit keeps each move). A worker
    without one of those channels cannot know it is an inbox: its hold is allowed."""
    by_id = {d["id"]: d for d in ledger.deliveries}
    out = []
    for r in ledger.releases or ():
        d = by_id.get(r["delivery_id"])
        mine = attempts.get(r["delivery_id"], [])
        if d is None or not mine:
            continue
        used = {a.get("provider") or d["channel"] for a in mine}
        if not used <= boxes or not used <= _channels_of(world, r["claimed_by"], boxes):
            continue
        if r["status"] == "in_doubt" or r.get("doubt") in ("assumed_sent", "held"):
            what = f"released {r['status']} ({r.get('doubt')}) by {r['claimed_by']}"
            out.append(_bad(d, f"{what} on an inbox channel, where nothing can be in doubt"))
    return out


def _channels_of(world: World, worker: str | None, boxes: set[str]) -> set[str]:
    """The inbox channels a worker (``A``, ``A#2``: a later incarnation) has."""
    name = (worker or "").split("#")[0]
    if name not in WORKER_NAMES[: len(world.workers)]:
        return set(boxes)
    has = world.workers[WORKER_NAMES.index(name)].channels
    return set(boxes) if has is None else boxes & set(has)


def _bad(d: dict[str, Any], what: str) -> Violation:
    return Violation(
        name=NAME, delivery=d["id"], detail=f"{what} (status={d['status']} doubt={d['doubt']})"
    )


def check_feed_preferences(ledger: Ledger, full: FullTruth, world: World) -> list[Violation]:
    """``preferences_honoured`` for the inbox (the module's text): the claim before
    each succeeded inbox attempt that wrote a message."""
    boxes = _boxes(world)
    if ledger.claims is None or not boxes or not ledger.feed_writes:
        return []
    claims = claims_of(ledger)
    by_id = {d["id"]: d for d in ledger.deliveries}
    written = {w["delivery_id"] for w in ledger.feed_writes}
    out = []
    for a in ledger.attempts:
        d = by_id.get(a["delivery_id"])
        if d is None or d["id"] not in written or a["status"] != "succeeded":
            continue
        if (a.get("provider") or d["channel"]) not in boxes:
            continue
        found = claim_verdict(world, full, claims, d, a)
        if found is not None:
            at, why = found
            out.append(
                Violation(
                    name="preferences_honoured",
                    delivery=d["id"],
                    detail=f"feed message written under a claim at t={at - world.base:.3f}, "
                    f"when the delivery was {why}",
                )
            )
    return out
