"""The invariants of a ``full`` schedule, against the provider models' truth.

Besides those of ``invariants`` (which every workload checks):

- ``preferences_honoured``: every request left under a claim taken while the
  recipient's preferences (certainly in force then: the last change had committed,
  none was under way) allowed it: not opted out (of everything, or of the type on the
  channel, or of a type that is off by default), outside quiet hours (unless the type
  is critical, or its window lies wholly inside them), inside the type's window
  (``localtime``, the explorer's own reading of send windows);
- ``key_window``: an idempotent provider never made a second message of a key (a
  resend that landed after the provider forgot the key), unless the channel chose
  at-least-once;
- ``rate_kept``: a channel's provider never got requests faster than its ``rate``
  (give or take how late after its slot a request may leave, ``rate_slack``);
- ``callback_truth``: what the provider said is what the record says: ``delivered``
  only if a message reached the user; ``bounced`` only if none reached them; a
  measured duplicate only when two reached them; no request after a callback ended
  the delivery (unless an operator retried it since); a delivery whose message the
  provider confirmed delivered ends ``delivered``, where kirim could tell it was its
  message (the callback carried the key, or named a message id kirim recorded);
- ``tombstone_truthful``: a pruned delivery asked for again is answered with the
  status and the doubt it had;
- ``fallback_tried``: a ``failed`` delivery with attempts left was refused by every
  channel of its chain (else it was lost with a fallback untried);
- ``retry_warned``: when an operator's retry led to a second message reaching the
  user, the retry's answer said a second copy was possible;
- ``reconcile_goes_on``: an operator's reconcile answers ``failed`` only for a delivery
  whose job has no attempt left (one that found nothing with attempts left goes on to
  its route: a fallback, or its channel again), whatever the operator does next;
- ``retired_unused``: no event that began after an address was retired (the
  provider called it dead) made a delivery to it (``kirim.addresses``);
- ``feed_exactly_once`` (``kirim.explore.inbox``): an inbox message is in its
  recipient's feed exactly once per key, under every schedule;
- ``liveness``: a delivery still waiting at the end waits for a reason: its job is
  due no later than the opening the recipient's preferences and the type's window
  allow (``localtime.opening``), give or take a minute.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kirim.explore import localtime
from kirim.explore.full import FullTruth, PrefsRecord
from kirim.explore.invariants import Ledger, Violation
from kirim.explore.provider import GroundTruth
from kirim.explore.world import World
from kirim.preferences import Preferences, Window
from kirim.worker.delivery import rate_slack

EPS = 1e-6
FINAL = ("sent", "delivered", "bounced", "failed", "canceled", "suppressed", "in_doubt")
NAMES = (
    "preferences_honoured",
    "key_window",
    "rate_kept",
    "callback_truth",
    "tombstone_truthful",
    "fallback_tried",
    "retry_warned",
    "reconcile_goes_on",
    "liveness",
    "retired_unused",
    "feed_exactly_once",  # kirim.explore.inbox
    "stream_faithful",  # kirim.explore.streams
    "topic_fanout_exactly_once",  # kirim.explore.topics
    "topic_runs_exactly_once",  # kirim.explore.topics
    "topic_cancel_honored",  # kirim.explore.topics
    "topic_counts_true",  # kirim.explore.topics
)


def at_least_once(
    world: World, delivery: dict[str, Any], attempts: Sequence[dict[str, Any]]
) -> bool:
    """Whether a delivery may reach its user twice by its channels' own choice: one of
    the channels its requests went to chose ``on_unknown = "retry"``."""
    used = {a.get("provider") or delivery["channel"] for a in attempts} | {delivery["channel"]}
    return any(c.on_unknown == "retry" for c in world.channels if c.name in used)


def check_full(
    ledger: Ledger,
    truth: GroundTruth,
    full: FullTruth,
    world: World,
    *,
    end: float,
    waiting: dict[int, float],
    patience: float = 60.0,
) -> list[Violation]:
    """Every violated invariant of a full schedule; ``end``: the store time the run
    ended; ``waiting``: delivery id -> run_at (store time) of the jobs left waiting;
    ``patience``: how far past the end a job may be due for reasons other than a send
    window (backoff, settling, a rate)."""
    attempts: dict[int, list[dict[str, Any]]] = {}
    for a in ledger.attempts:
        attempts.setdefault(a["delivery_id"], []).append(a)
    out: list[Violation] = []
    out += _preferences(ledger, truth, full, world)
    out += _key_window(ledger, truth, world, attempts)
    out += _rate(truth, world)
    out += _callbacks(ledger, truth)
    out += _tombstones(ledger, full)
    out += _fallback(ledger, world, attempts)
    out += _retries(ledger, truth, full, world, attempts)
    out += _reconciles(full)
    out += _liveness(ledger, full, world, end=end, waiting=waiting, patience=patience)
    out += _retired_unused(ledger, full, world)
    return out


def _retired_unused(ledger: Ledger, full: FullTruth, world: World) -> list[Violation]:
    """``retired_unused`` (the module's text); a retirement's store time less the
    world's base is its virtual time."""
    retired = {
        (a.channel, a.address): a.retired_at - world.base
        for a in full.addresses
        if a.retired_at is not None
    }
    if not retired:
        return []
    by_id = {d["id"]: d for d in ledger.deliveries}
    out = []
    for send in full.sends:
        for o in send.outcomes:
            d = by_id.get(o[2])
            if d is None or not o[8] or send.type is None:
                continue
            at = retired.get((d["channel"], d["recipient"]))
            if at is not None and send.at > at + EPS:
                out.append(
                    Violation(
                        name="retired_unused",
                        delivery=d["id"],
                        detail=f"event {send.event_id} at t={send.at:.3f} went to an address "
                        f"of {d['channel']} retired at t={at:.3f}",
                    )
                )
    return out


# -- preferences -------------------------------------------------------------------------


def prefs_at(
    records: Sequence[PrefsRecord], recipient: str, at: float
) -> tuple[bool, Preferences | None]:
    """(certain, the preferences in force at virtual time ``at``): the last change that
    had committed before ``at``; not certain while another one was under way, nor when
    the last two were under way together."""
    mine = [r for r in records if r.recipient == recipient]
    if any(
        r.started <= at + EPS and (r.committed is None or r.committed >= at - EPS) for r in mine
    ):
        return False, None
    done = [r for r in mine if r.committed is not None and r.committed < at - EPS]
    if not done:
        return True, None
    # the last to return in the driver's own order: virtual time can stand still over
    # several writes (seed 9384: an opt-out, then its deletion, both at t=49.000)
    last = max(done, key=lambda r: r.ended or 0)
    overlapped = [
        r
        for r in done
        if r is not last and r.begun < (last.ended or 0) and last.begun < (r.ended or 0)
    ]
    if any(r.prefs != last.prefs for r in overlapped):
        return False, None  # two writes under way together: which committed last is unknown
    return True, last.prefs


def verdict(world: World, d: dict[str, Any], prefs: Preferences | None, at: float) -> str | None:
    """Why a delivery of a type may not go at store time ``at`` (None: it may)."""
    plan = world.type_plan(d["type"])
    if plan is None:
        return None
    table = plan.table
    critical = bool(table.get("critical"))
    channel = d["channel"]
    if not critical:
        if prefs is not None and prefs.opt_out:
            return "opted out"
        said = None if prefs is None else prefs.choice(plan.name, channel)
        if said is False:
            return f"opted out of {plan.name}:{channel}"
        if said is None and not table.get("defaults", {}).get(channel, True):
            return f"{plan.name} is off by default on {channel}"
    window = Window.parse(table["window"]) if "window" in table else None
    quiet = None if critical or prefs is None else prefs.quiet_hours
    zone = (prefs.timezone if prefs is not None else None) or "UTC"
    if not localtime.allowed(at, zone, quiet=quiet, window=window):
        return f"outside its send window (quiet={quiet}, window={window}, zone={zone})"
    return None


def claim_verdict(
    world: World,
    full: FullTruth,
    claims: dict[int, list[float]],
    d: dict[str, Any],
    a: dict[str, Any],
) -> tuple[float, str] | None:
    """The claim attempt ``a`` of delivery ``d`` was made under (the last before its
    request) and why the recipient's preferences, known for certain then, said it must
    not go; None when they let it go (or ``d`` has no type and recipient)."""
    if d["type"] is None or d["recipient_id"] is None:
        return None
    before = [t for t in claims.get(a["job_id"], []) if t <= a["requested_at"] + EPS]
    if not before:
        return None
    at = before[-1]
    certain, prefs = prefs_at(full.prefs, d["recipient_id"], at - world.base)
    if not certain:
        return None
    why = verdict(world, d, prefs, at)
    return None if why is None else (at, why)


def claims_of(ledger: Ledger) -> dict[int, list[float]]:
    """The times each job was leased (the claim audit), in order."""
    out: dict[int, list[float]] = {}
    for c in ledger.claims or ():
        out.setdefault(c["job_id"], []).append(float(c["at"]))
    return {k: sorted(v) for k, v in out.items()}


def _preferences(
    ledger: Ledger, truth: GroundTruth, full: FullTruth, world: World
) -> list[Violation]:
    if ledger.claims is None:
        return []
    claims = claims_of(ledger)
    rows = {a["provider_request_id"]: a for a in ledger.attempts}
    by_key = {d["idempotency_key"]: d for d in ledger.deliveries}
    out = []
    for r in truth.requests:
        d = by_key.get(r.key)
        a = rows.get(r.request_id)
        if d is None or a is None:
            continue
        found = claim_verdict(world, full, claims, d, a)
        if found is not None:
            at, why = found
            out.append(
                Violation(
                    name="preferences_honoured",
                    delivery=d["id"],
                    detail=f"request {r.request_id[:8]} at t={r.sent_at:.3f} under a claim at "
                    f"t={at - world.base:.3f}, when the delivery was {why}",
                )
            )
    return out


# -- providers ---------------------------------------------------------------------------


def _key_window(
    ledger: Ledger, truth: GroundTruth, world: World, attempts: dict[int, list[dict[str, Any]]]
) -> list[Violation]:
    by_key = {d["idempotency_key"]: d for d in ledger.deliveries}
    out = []
    for plan in world.channels:
        if not plan.idempotent:
            continue
        seen: dict[str, list[float]] = {}
        for c in truth.copies:
            if c.provider == plan.name and c.counted:
                seen.setdefault(c.key, []).append(c.at)
        for key, times in seen.items():
            d = by_key.get(key)
            if len(times) < 2 or d is None or at_least_once(world, d, attempts.get(d["id"], [])):
                continue
            if _epochs_apart(truth, d["id"], times):
                continue
            out.append(
                Violation(
                    name="key_window",
                    delivery=d["id"],
                    detail=f"{plan.name} (dedup window {plan.dedup_window}) made {len(times)} "
                    f"messages of one key, at t={', '.join(f'{t:.3f}' for t in times)}",
                )
            )
    return out


def _epochs_apart(truth: GroundTruth, delivery_id: int, times: Sequence[float]) -> bool:
    """Whether the times fall into different epochs of the operator's retries only."""
    cuts = sorted(truth.retries.get(delivery_id, []))
    epochs = [sum(1 for c in cuts if c < t) for t in times]
    return len(set(epochs)) == len(epochs)


def _rate(truth: GroundTruth, world: World) -> list[Violation]:
    out = []
    for plan in world.channels:
        if plan.rate is None:
            continue
        sent = sorted(r.sent_at for r in truth.requests if r.provider == plan.name)
        interval = 1.0 / plan.rate
        late = rate_slack(plan.rate) + 0.05  # how late after its slot a request may leave
        for i in range(len(sent)):
            for j in range(i + 1, len(sent)):
                # slots are spaced by the store's clock; a host's sleep runs 2 % off
                least = (j - i) * interval * 0.98 - late
                if sent[j] - sent[i] < least:
                    out.append(
                        Violation(
                            name="rate_kept",
                            delivery=None,
                            detail=f"{plan.name} (rate {plan.rate}/s) got {j - i + 1} requests "
                            f"in {sent[j] - sent[i]:.3f} s (t={sent[i]:.3f} to {sent[j]:.3f})",
                        )
                    )
                    return out
    return out


# -- callbacks ---------------------------------------------------------------------------


def _callbacks(ledger: Ledger, truth: GroundTruth) -> list[Violation]:
    out = []
    attempts_of: dict[int, list[dict[str, Any]]] = {}
    for a in ledger.attempts:
        attempts_of.setdefault(a["delivery_id"], []).append(a)

    def bad(did: int | None, detail: str) -> None:
        out.append(Violation(name="callback_truth", delivery=did, detail=detail))

    for d in ledger.deliveries:
        did, key, status = d["id"], d["idempotency_key"], d["status"]
        since = max(truth.retries.get(did, [0.0]))
        copies = [c for c in truth.copies if c.key == key]
        delivered = [c for c in copies if c.fate == "delivered"]
        recent = [c for c in delivered if c.at >= since]
        if status == "delivered" and not delivered:
            bad(did, f"delivered, but no message reached the user ({len(copies)} bounced)")
        if status == "bounced" and recent:
            bad(did, f"bounced, but {len(recent)} message(s) reached the user")
        mine = [cb for cb in truth.callbacks if cb.copy.key == key]
        if any(cb.duplicate for cb in mine) and len(delivered) < 2:
            bad(did, f"a measured duplicate, but {len(delivered)} message(s) reached the user")
        ended = [
            cb.answered_at
            for cb in mine
            if cb.answered_at is not None
            and cb.outcome == "applied"
            and cb.result_status in ("delivered", "bounced")
        ]
        if ended:
            first = min(ended)
            later = [c for c in truth.retries.get(did, []) if c > first]
            limit = min(later) if later else math.inf
            for r in truth.requests:
                if r.key == key and first + EPS < r.sent_at < limit:
                    bad(
                        did,
                        f"request at t={r.sent_at:.3f} after a callback ended it at t={first:.3f}",
                    )
                    break
        known = {a["provider_message_id"] for a in attempts_of.get(did, [])}
        known.add(d["provider_message_id"])
        posted = [  # what kirim can match: the key, or a message id it recorded
            cb
            for cb in mine
            if cb.status == "delivered"
            and cb.sent_at >= since
            and (cb.key is not None or cb.copy.message_id in known)
        ]
        gone = d.get("explore_pruned")
        if posted and not gone and status not in ("delivered", "canceled"):
            bad(
                did,
                f"{len(posted)} delivered callback(s) posted "
                f"({', '.join(sorted({cb.outcome for cb in posted}))}), but the delivery "
                f"is {status}",
            )
    return out


# -- retention, failover, operators ------------------------------------------------------


def _tombstones(ledger: Ledger, full: FullTruth) -> list[Violation]:
    rows = {d["id"]: d for d in ledger.deliveries}
    out = []
    for p in full.probes:
        d = rows.get(p.delivery)
        if d is None or p.created:
            continue
        if p.status != d["status"] or p.doubt != d["doubt"]:
            out.append(
                Violation(
                    name="tombstone_truthful",
                    delivery=p.delivery,
                    detail=f"pruned as {d['status']} (doubt {d['doubt']}), answered "
                    f"{p.status} (doubt {p.doubt})",
                )
            )
    return out


def _fallback(
    ledger: Ledger, world: World, attempts: dict[int, list[dict[str, Any]]]
) -> list[Violation]:
    jobs: dict[int, list[dict[str, Any]]] = {}
    for j in ledger.jobs:
        jobs.setdefault(j["delivery_id"], []).append(j)
    out = []
    for d in ledger.deliveries:
        if d["status"] != "failed" or d.get("explore_pruned"):
            continue
        mine = sorted(jobs.get(d["id"], []), key=lambda j: j["id"])
        if not mine or mine[-1]["attempts"] >= mine[-1]["max_attempts"]:
            continue
        plan = next((c for c in world.channels if c.name == d["channel"]), None)
        if plan is None:
            continue
        since = d["released_at"] or 0.0
        tried = {
            a.get("provider") or d["channel"]
            for a in attempts.get(d["id"], [])
            if a["requested_at"] >= since and a["status"] == "failed_permanent"
        }
        untried = [c for c in (plan.name, *plan.fallback) if c not in tried]
        if untried and (d["last_error"] or "").find("digest") < 0:
            out.append(
                Violation(
                    name="fallback_tried",
                    delivery=d["id"],
                    detail=f"failed with attempts left ({mine[-1]['attempts']} of "
                    f"{mine[-1]['max_attempts']}), not refused for good by {untried}: "
                    f"{d['last_error']}",
                )
            )
    return out


def _retries(
    ledger: Ledger,
    truth: GroundTruth,
    full: FullTruth,
    world: World,
    attempts: dict[int, list[dict[str, Any]]],
) -> list[Violation]:
    out = []
    for d in ledger.deliveries:
        did = d["id"]
        epochs = truth.epochs(d["idempotency_key"], did)
        if len(epochs) < 2 or sum(epochs) < 2 or at_least_once(world, d, attempts.get(did, [])):
            continue
        retried = [a for a in full.actions if a.kind == "retry" and a.done and a.delivery == did]
        for i, action in enumerate(retried, start=1):
            got_before = sum(epochs[:i])
            if got_before and epochs[i] and action.warned is not True:
                out.append(
                    Violation(
                        name="retry_warned",
                        delivery=did,
                        detail=f"the operator's retry at t={action.at:.3f} sent a second copy "
                        f"(per retry: {epochs}); its answer said second_copy_possible="
                        f"{action.warned}",
                    )
                )
                break
    return out


def _reconciles(full: FullTruth) -> list[Violation]:
    """``reconcile_goes_on`` (the module's text), judged on each reconcile's own answer:
    an operator's retry of the dead letter afterwards would hide it from the ledger."""
    return [
        Violation(
            name="reconcile_goes_on",
            delivery=a.delivery,
            detail=f"the operator's reconcile at t={a.at:.3f} answered failed with "
            "attempts left: its route ended with no channel refusing it for good",
        )
        for a in full.actions
        if a.kind == "reconcile" and a.done and a.answered == "failed" and a.attempts_left
    ]


def _liveness(
    ledger: Ledger,
    full: FullTruth,
    world: World,
    *,
    end: float,
    waiting: dict[int, float],
    patience: float,
) -> list[Violation]:
    """A job left waiting at the end is due no later than the next opening (from the
    end) that some version of its recipient's preferences (in force at or after the
    delivery was made) allows, give or take ``patience``: a deferral made under
    stricter preferences keeps its time when they are relaxed."""
    out = []
    rows = {d["id"]: d for d in ledger.deliveries}
    for did, run_at in waiting.items():
        d = rows.get(did)
        if d is None:
            continue
        made = float(d["created_at"])
        versions = _versions(full.prefs, d["recipient_id"] or "", made - world.base)
        opens = max(_opening(world, d, prefs, end) for _, prefs in versions)
        if run_at > max(opens, end) + patience:
            out.append(
                Violation(
                    name="liveness",
                    delivery=did,
                    detail=f"{d['status']}, its job due at t={run_at - world.base:.3f}, though it "
                    f"may go from t={opens - world.base:.3f}",
                )
            )
    return out


def _versions(
    records: Sequence[PrefsRecord], recipient: str, since: float
) -> list[tuple[float, Preferences | None]]:
    """(virtual time it took effect, preferences) of every version of ``recipient``'s
    preferences in force at or after ``since``."""
    mine = sorted(
        (r for r in records if r.recipient == recipient and r.committed is not None),
        key=lambda r: r.committed or 0.0,
    )
    out: list[tuple[float, Preferences | None]] = [(-1.0, None)] if not mine else []
    for i, r in enumerate(mine):
        following = mine[i + 1].committed if i + 1 < len(mine) else math.inf
        if following is not None and following >= since - EPS:  # one instant: either order
            out.append((r.started, r.prefs))
    return out or [(-1.0, None)]


def _opening(world: World, d: dict[str, Any], prefs: Preferences | None, at: float) -> float:
    """When a waiting delivery may go (store time; inf: it will be suppressed)."""
    plan = world.type_plan(d["type"])
    if plan is None:
        return at
    critical = bool(plan.table.get("critical"))
    off = prefs is not None and (prefs.opt_out or prefs.choice(plan.name, d["channel"]) is False)
    if off and not critical:
        return math.inf
    table = plan.table
    window = Window.parse(table["window"]) if "window" in table else None
    quiet = None if table.get("critical") or prefs is None else prefs.quiet_hours
    zone = (prefs.timezone if prefs is not None else None) or "UTC"
    return localtime.opening(at, zone, quiet=quiet, window=window)
