"""The invariants, checked against the provider's ground truth at the end of a run.

The final state is read with plain SQL (``Ledger``), not through kirim's store:

- ``at_most_once``: a user receives a notification at most once, unless its
  channel chose ``on_unknown = "retry"``; an operator's retry starts a new epoch
  (what landed before it was the operator's to see), so it counts per epoch;
- ``certain_sent``: ``sent`` with no doubt (or doubt ``resolved``) → received;
- ``certain_unsent``: ``failed``, or ``canceled`` without doubt → never received;
- ``lost_as_sent``: ``sent`` (assumed) while every attempt definitely failed and
  the user got nothing: the ledger knew it was not delivered and kept quiet;
- ``intent_first``: every provider request has its attempt row, committed before
  the request left, by the worker that held the claim and the lease at that time
  (``explore_intent_audit``, written by a trigger inside the insert);
- ``fenced_intent``: every intent row (whether or not a request followed) was written
  while its worker held the delivery's claim and the job's lease: the fence itself,
  which the send deadline backs up but does not replace;
- ``no_request_after_cancel``: no request left after a committed cancel;
- ``final``: the run ended with every delivery final (or held ``in_doubt``), no
  job left to run, nothing in flight at the provider;
- ``unreported_doubt``: a delivery whose last requests may have arrived is not
  reported as certain (``failed``, ``suppressed``, or ``sent`` with no doubt and no
  success);
- ``one_provider_in_doubt``: after an attempt to a provider that may have arrived
  (it ends ``requested`` or ``unknown``), no later attempt of the delivery goes to
  another provider (failover only after a definite non-acceptance), within an epoch.
- ``claims_at_rest``: a delivery that is not ``processing`` holds no claim (no claim
  token, no claim expiry), and a job that is not ``running`` no lease (no lease owner,
  token or expiry): what a transition ends it writes back, column by column (SQLite
  sets only the columns that changed: ``kirim.store.sqlite.changed``).
- ``jobs_of_attempts``: every attempt still kept names a job of its own delivery (the
  intent's job: PostgreSQL holds no foreign key from the attempts to the jobs since
  schema 18, and retention deletes a delivery's attempts with its jobs).

The notification layer (the events workload, ``events.py``):

- ``suppressed_unsent``: a ``suppressed`` delivery was never received, and every
  request for its key (since the operator's last retry) was definitely refused, as
  the provider saw it and as its attempt rows say (a claim after a definite refusal
  may suppress; one after a request that may have arrived may not, unless the
  provider, asked once the requests settled, had none: doubt ``resolved``, and then
  none of them acted);
- ``digest_once``: each event taken into a digest (``kirim_digest_events``) is in the
  sealed payload (``events``) of exactly its own digest's delivery once that digest is
  sealed, in no other digest's payload of its stream, and in none while unsealed; a
  digest whose delivery has an attempt is sealed, and every request for it carried
  the sealed event list; every event the driver gave a digest and was not told
  ``suppressed`` is held by the digest it was told;
- ``opted_out_unsent``: a delivery whose recipient was opted out (of everything, or
  of its type on its channel) when its job was first claimed is never claimed to be
  sent: no claim leases it and no request for it leaves. The first claim is read from
  ``explore_claim_audit`` (a trigger records each new lease of a job with the claim's
  store time; the ledger itself keeps only a count of claims); a flip counts once the
  driver's ``set_preferences`` has returned, strictly before that claim.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from kirim.chaos import CERTAINLY_NOT_ACTED, Report, Tally, tally
from kirim.explore.loop import BASE
from kirim.explore.provider import FlipRecord, GroundTruth, Request

NAMES = (
    "at_most_once",
    "certain_sent",
    "certain_unsent",
    "lost_as_sent",
    "intent_first",
    "fenced_intent",
    "no_request_after_cancel",
    "final",
    "unreported_doubt",
    "one_provider_in_doubt",
    "claims_at_rest",
    "jobs_of_attempts",
    "suppressed_unsent",
    "digest_once",
    "opted_out_unsent",
    "known_edges",
    "finish_by_claim",
)
DEFINITE = ("failed_transient", "failed_permanent")
DOUBTFUL = ("requested", "unknown")
#: what the provider model answers when it did not act on a request, for certain
REFUSED = tuple(sorted(fate.value for fate in CERTAINLY_NOT_ACTED))
EPSILON = 1e-9
#: store times are BASE + virtual time: a double keeps about 2.4e-7 s of that
STORE_EPSILON = 1e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    name: str
    delivery: int | None
    detail: str

    def __str__(self) -> str:
        where = "" if self.delivery is None else f" delivery {self.delivery}"
        return f"{self.name}{where}: {self.detail}"


@dataclass(slots=True, kw_only=True)
class Ledger:
    deliveries: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    audit: list[dict[str, Any]] | None  # None: no intent audit trigger
    digests: list[dict[str, Any]] = field(default_factory=list)
    digest_events: list[dict[str, Any]] = field(default_factory=list)
    #: every new lease of a job (``explore_claim_audit``); None: no such trigger
    claims: list[dict[str, Any]] | None = None
    #: every feed message ever written, the in-app inbox (``explore_feed_audit``)
    feed_writes: list[dict[str, Any]] = field(default_factory=list)
    #: the feed's rows at the end (deleted ones included: a deletion keeps its row)
    feed_rows: list[dict[str, Any]] = field(default_factory=list)
    #: every workflow run ever started (``explore_run_audit``: pruned ones included)
    runs: list[dict[str, Any]] = field(default_factory=list)
    #: each move of a delivery out of ``processing`` and each attempt outcome written,
    #: with their transactions (``kirim.explore.finishes``); None: no such triggers
    releases: list[dict[str, Any]] | None = None
    outcomes: list[dict[str, Any]] | None = None

    @staticmethod
    def read_sqlite(path: str) -> Ledger:
        conn = sqlite3.connect(path)
        conn.row_factory = sqlite3.Row
        try:

            def rows(sql: str) -> list[dict[str, Any]]:
                return [dict(r) for r in conn.execute(sql).fetchall()]

            pruned = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'explore_pruned_deliveries'"
            ).fetchone()
            gone_d = gone_a = []
            if pruned:  # what prune deleted, marked (``hosts.pruned_audit``)
                gone_d = rows("SELECT *, 1 AS explore_pruned FROM explore_pruned_deliveries")
                gone_a = rows("SELECT * FROM explore_pruned_attempts")
            live = rows("SELECT * FROM kirim_deliveries ORDER BY id")
            ids = {d["id"] for d in live}
            deliveries = sorted(
                live + [d for d in gone_d if d["id"] not in ids], key=lambda d: d["id"]
            )
            finishes = conn.execute(  # the finish audits (``kirim.explore.finishes``)
                "SELECT 1 FROM sqlite_master WHERE name = 'explore_release_audit'"
            ).fetchone()
            live_a = rows("SELECT * FROM kirim_attempts ORDER BY id")
            seen = {a["id"] for a in live_a}
            return Ledger(
                deliveries=deliveries,
                attempts=sorted(
                    live_a + [a for a in gone_a if a["id"] not in seen], key=lambda a: a["id"]
                ),
                jobs=rows("SELECT * FROM kirim_jobs ORDER BY id"),
                audit=rows("SELECT * FROM explore_intent_audit"),
                digests=rows("SELECT * FROM kirim_digests ORDER BY key"),
                digest_events=rows("SELECT * FROM kirim_digest_events ORDER BY id"),
                claims=rows("SELECT * FROM explore_claim_audit ORDER BY rowid"),
                feed_writes=rows("SELECT * FROM explore_feed_audit ORDER BY id"),
                feed_rows=rows("SELECT * FROM kirim_feed ORDER BY id"),
                runs=rows("SELECT * FROM explore_run_audit ORDER BY id"),
                releases=rows("SELECT * FROM explore_release_audit") if finishes else None,
                outcomes=rows("SELECT * FROM explore_outcome_audit") if finishes else None,
            )
        finally:
            conn.close()


#: the kept callbacks a delivery's message or key now matches (both lanes' databases:
#: the reaper has yet to apply them, so a run is not over)
KEPT_CALLBACKS_SQL = (
    "SELECT COUNT(*) FROM kirim_callback_inbox k WHERE EXISTS ("
    " SELECT 1 FROM kirim_attempts a WHERE a.provider_message_id = k.message_id)"
    " OR EXISTS (SELECT 1 FROM kirim_deliveries d"
    " WHERE d.provider_message_id = k.message_id)"
    " OR EXISTS (SELECT 1 FROM kirim_deliveries d WHERE d.idempotency_key = k.key)"
)
#: the pruned deliveries whose key's tombstone is still kept (the tombstone probe)
PRUNED_WITH_TOMBSTONES_SQL = (
    "SELECT p.* FROM explore_pruned_deliveries p "
    "JOIN kirim_key_tombstones t ON t.delivery_id = p.id ORDER BY p.id"
)


def check(
    ledger: Ledger,
    truth: GroundTruth,
    *,
    at_least_once: bool | Callable[[dict[str, Any]], bool],
    quiet: bool,
    waiting: Collection[int] = (),
    in_commit: Collection[str] = (),
) -> list[Violation]:
    """Every violated invariant (``quiet``: the run reached quiescence in its bounds).
    ``at_least_once``: whether the channel chose it (or, per delivery, a function
    that says); ``waiting``: deliveries whose jobs wait far ahead for a reason the
    caller checks (a send window), not counted as unfinished; ``in_commit``: channels
    whose effect is written in the finish's own commit (the inbox), whose attempts
    never committed had none (``kirim.explore.inbox`` checks that premise on the feed
    audit: no message without a succeeded attempt)."""
    out: list[Violation] = []
    by_key = {d["idempotency_key"]: d for d in ledger.deliveries}
    attempts: dict[int, list[dict[str, Any]]] = {}
    for a in ledger.attempts:
        attempts.setdefault(a["delivery_id"], []).append(a)
    for d in ledger.deliveries:
        once = at_least_once(d) if callable(at_least_once) else at_least_once
        out.extend(_delivery(d, attempts.get(d["id"], []), truth, once, in_commit))
    out.extend(_at_rest(ledger))
    out.extend(_jobs_of_attempts(ledger))
    out.extend(_requests(ledger, truth, by_key))
    out.extend(_suppressed(ledger, truth, attempts))
    out.extend(_digests(ledger, truth, attempts))
    out.extend(_opted_out(ledger, truth))
    active = [
        j
        for j in ledger.jobs
        if j["status"] in ("queued", "running", "retry_scheduled")
        and j["delivery_id"] not in waiting
    ]
    if not quiet or active or truth.in_flight:
        unfinished = [
            d["id"]
            for d in ledger.deliveries
            if d["status"] in ("pending", "processing") and (not quiet or d["id"] not in waiting)
        ]
        out.append(
            Violation(
                name="final",
                delivery=None,
                detail=f"not quiescent: deliveries {unfinished} unfinished, {len(active)} jobs "
                f"active, {truth.in_flight} requests in flight",
            )
        )
    return out


def _delivery(
    d: dict[str, Any],
    attempts: Sequence[dict[str, Any]],
    truth: GroundTruth,
    at_least_once: bool,
    in_commit: Collection[str] = (),
) -> list[Violation]:
    out = []
    status, doubt, did = d["status"], d["doubt"], d["id"]
    epochs = truth.epochs(d["idempotency_key"], did)
    got = epochs[-1]  # since the operator's last retry
    shown = f"status={status} doubt={doubt} received={got}"
    if len(epochs) > 1:
        shown += f" (per operator retry: {epochs})"
    if max(epochs) > 1 and not at_least_once:
        out.append(Violation(name="at_most_once", delivery=did, detail=shown))
    made = _made(truth, d["idempotency_key"], epochs)
    if status == "sent" and doubt in (None, "resolved") and made == 0:
        out.append(Violation(name="certain_sent", delivery=did, detail=shown))
    if (status == "failed" or (status == "canceled" and doubt is None)) and got > 0:
        out.append(Violation(name="certain_unsent", delivery=did, detail=shown))
    since = d["released_at"] or 0.0
    statuses = [a["status"] for a in attempts if a["requested_at"] >= since]
    # the user got nothing at all (in any epoch): a lookup after an operator's retry may
    # rightly find the effect of a request of an earlier epoch
    if status == "sent" and made == 0 and statuses and all(s in DEFINITE for s in statuses):
        out.append(
            Violation(
                name="lost_as_sent",
                delivery=did,
                detail=f"{shown}; every attempt definitely failed: {statuses}",
            )
        )
    out.extend(_one_provider(did, [a for a in attempts if a["requested_at"] >= since]))
    open_doubt = [
        a
        for a in attempts
        if a["status"] in DOUBTFUL
        and a["requested_at"] >= since
        and (a.get("provider") or d["channel"]) not in in_commit
    ]
    succeeded = any(a["status"] == "succeeded" for a in attempts)
    # suppressed too: it says nothing was sent (the preferences stopped it)
    certain = status in ("failed", "suppressed") or (
        status == "sent" and doubt is None and not succeeded
    )
    if open_doubt and certain:
        out.append(
            Violation(
                name="unreported_doubt",
                delivery=did,
                detail=f"{shown}; {len(open_doubt)} attempt(s) may have arrived",
            )
        )
    return out


def _at_rest(ledger: Ledger) -> list[Violation]:
    """``claims_at_rest``: no claim outlives ``processing``, no lease ``running``."""
    out = []
    for d in ledger.deliveries:
        held = [c for c in ("claim_token", "claim_expires_at") if d[c] is not None]
        if d["status"] != "processing" and held:
            detail = f"{d['status']} delivery still holds {', '.join(held)}"
            out.append(Violation(name="claims_at_rest", delivery=d["id"], detail=detail))
    for j in ledger.jobs:
        held = [c for c in ("lease_owner", "lease_token", "lease_expires_at") if j[c] is not None]
        if j["status"] != "running" and held:
            detail = f"{j['status']} job {j['id']} still holds {', '.join(held)}"
            out.append(Violation(name="claims_at_rest", delivery=j["delivery_id"], detail=detail))
    return out


def _jobs_of_attempts(ledger: Ledger) -> list[Violation]:
    """``jobs_of_attempts``: an attempt of a delivery still kept names one of its jobs."""
    jobs = {j["id"]: j["delivery_id"] for j in ledger.jobs}
    pruned = {d["id"] for d in ledger.deliveries if d.get("explore_pruned")}
    return [
        Violation(
            name="jobs_of_attempts",
            delivery=a["delivery_id"],
            detail=f"attempt {a['provider_request_id']} names job {a['job_id']}, "
            + ("which is gone" if a["job_id"] not in jobs else "a job of another delivery"),
        )
        for a in ledger.attempts
        if a["delivery_id"] not in pruned and jobs.get(a["job_id"]) != a["delivery_id"]
    ]


def _made(truth: GroundTruth, key: str, epochs: Sequence[int]) -> int:
    """Messages the providers made of ``key`` (a bounced one too: the provider accepted
    it), or the user's receipts where no copies are recorded."""
    if not truth.copies:
        return sum(epochs)
    return sum(1 for c in truth.copies if c.key == key)


def _one_provider(did: int, attempts: Sequence[dict[str, Any]]) -> list[Violation]:
    """``one_provider_in_doubt``: once a request to P may have arrived, only P."""
    first = next(
        (a for a in sorted(attempts, key=lambda a: a["id"]) if a["status"] in DOUBTFUL), None
    )
    if first is None:
        return []
    to = first.get("provider")
    return [
        Violation(
            name="one_provider_in_doubt",
            delivery=did,
            detail=f"attempt {a['provider_request_id']} went to {a.get('provider')} after "
            f"{first['provider_request_id']} to {to}, which may have arrived",
        )
        for a in attempts
        if a["id"] > first["id"] and a.get("provider") != to
    ][:1]


def _fenced(a: dict[str, Any]) -> bool:
    """Whether an audited intent was written by the holder of the claim and the lease."""
    return (
        a["claim_token"] is not None
        and a["claim_token"] == a["lease_token"]
        and a["claimed_by"] == a["worker_id"] == a["lease_owner"]
        and a["delivery_status"] == "processing"
        and a["job_status"] == "running"
    )


def _intents(ledger: Ledger) -> list[Violation]:
    """``fenced_intent``: every intent row, sent or not, was written under the claim."""
    return [
        Violation(
            name="fenced_intent",
            delivery=None,
            detail=f"intent {a['provider_request_id']} written by {a['worker_id']} without "
            f"the claim: {a}",
        )
        for a in ledger.audit or ()
        if not _fenced(a)
    ]


def _requests(
    ledger: Ledger, truth: GroundTruth, by_key: dict[str, dict[str, Any]]
) -> list[Violation]:
    out = _intents(ledger)
    rows = {a["provider_request_id"]: a for a in ledger.attempts}
    audit = None if ledger.audit is None else {a["provider_request_id"]: a for a in ledger.audit}
    for r in truth.requests:
        delivery = by_key.get(r.key)
        did = None if delivery is None else delivery["id"]
        row = rows.get(r.request_id)
        committed = truth.intents.get(r.request_id)
        if row is None or committed is None or committed > r.sent_at + EPSILON:
            out.append(
                Violation(
                    name="intent_first",
                    delivery=did,
                    detail=f"request sent at t={r.sent_at:.3f} without an intent committed "
                    f"before it (row={'yes' if row else 'no'}, committed at {committed})",
                )
            )
        elif audit is not None:
            a = audit.get(r.request_id)
            if a is None or not _fenced(a):
                out.append(
                    Violation(
                        name="intent_first",
                        delivery=did,
                        detail=f"intent of the request at t={r.sent_at:.3f} written by "
                        f"{r.caller} without a valid claim: {a}",
                    )
                )
        canceled = None if did is None else truth.cancels.get(did)
        if canceled is not None and r.sent_at > canceled + EPSILON:
            out.append(
                Violation(
                    name="no_request_after_cancel",
                    delivery=did,
                    detail=f"request at t={r.sent_at:.3f} after the cancel at t={canceled:.3f}",
                )
            )
    return out


# -- the notification layer -----------------------------------------------------------


def _requests_of(truth: GroundTruth, key: str, delivery_id: int) -> list[Request]:
    """The requests for ``key`` since the operator's last retry of the delivery."""
    since = max(truth.retries.get(delivery_id, [0.0]))
    return [r for r in truth.requests if r.key == key and r.sent_at >= since]


def _suppressed(
    ledger: Ledger, truth: GroundTruth, attempts: dict[int, list[dict[str, Any]]]
) -> list[Violation]:
    """``suppressed_unsent``: suppressed means never sent, as far as anyone could know."""
    out = []
    for d in ledger.deliveries:
        if d["status"] != "suppressed":
            continue
        did, key = d["id"], d["idempotency_key"]
        got = truth.epochs(key, did)[-1]
        # what the provider acted on (at the end of the run every request's effect is
        # known); kirim's own uncertainty is open_ below
        landed = [
            r
            for r in _requests_of(truth, key, did)
            if r.outcome not in REFUSED and r.effect_at is not None
        ]
        since = d["released_at"] or 0.0
        open_ = [
            a["status"]
            for a in attempts.get(did, [])
            if a["requested_at"] >= since and a["status"] not in DEFINITE
        ]
        if d["doubt"] == "resolved":  # the provider, asked once settled, had none of them
            landed = [r for r in landed if r.effect_at is not None]
            open_ = []
        if got or landed or open_:
            out.append(
                Violation(
                    name="suppressed_unsent",
                    delivery=did,
                    detail=f"suppressed ({d['reason']}) but received={got}, "
                    f"{len(landed)} request(s) the provider may have acted on "
                    f"({[r.outcome for r in landed]}), attempts not refused: {open_}",
                )
            )
    return out


def _sealed_events(d: dict[str, Any] | None) -> list[str] | None:
    """The event ids of a delivery's sealed digest payload, or None (no events in it)."""
    if d is None:
        return None
    payload = d["payload"]
    if isinstance(payload, str):
        payload = json.loads(payload)
    events = payload.get("events") if isinstance(payload, dict) else None
    return [str(e) for e in events] if isinstance(events, list) else None


def _digests(
    ledger: Ledger, truth: GroundTruth, attempts: dict[int, list[dict[str, Any]]]
) -> list[Violation]:
    """``digest_once``: each event in one sealed digest of its stream, sent as sealed."""
    out: list[Violation] = []

    def bad(did: int | None, detail: str) -> None:
        out.append(Violation(name="digest_once", delivery=did, detail=detail))

    deliveries = {d["id"]: d for d in ledger.deliveries}
    held: dict[str, list[str]] = {}
    for e in ledger.digest_events:
        held.setdefault(e["digest_key"], []).append(str(e["event_id"]))
    in_payloads: dict[tuple[str, str], list[str]] = {}
    for g in ledger.digests:
        d = deliveries.get(g["delivery_id"])
        did = None if d is None else d["id"]
        sealed = _sealed_events(d)
        own = held.get(g["key"], [])
        for eid in sealed or ():
            in_payloads.setdefault((g["stream"], eid), []).append(g["key"])
        if g["sealed_at"] is not None:
            if d is not None and sealed != own:
                bad(did, f"digest sealed with events {sealed}, but it holds {own}")
        elif sealed:  # the placeholder lists none
            bad(did, f"digest not sealed, but its payload lists events {sealed}")
        if d is None:
            continue
        tried = attempts.get(d["id"], [])
        if tried and g["sealed_at"] is None:
            bad(did, f"{len(tried)} attempt(s) of a digest that was never sealed")
        for r in truth.requests:
            if r.key == d["idempotency_key"] and r.events != tuple(sealed or ()):
                bad(
                    did,
                    f"a request at t={r.sent_at:.3f} carried events {r.events}, the "
                    f"sealed payload lists {sealed}",
                )
    for (of, eid), keys in sorted(in_payloads.items()):
        if len(keys) > 1:
            bad(None, f"event {eid} of stream {of} is in {len(keys)} sealed digests")
    streams = {(e["stream"], str(e["event_id"])): e["digest_key"] for e in ledger.digest_events}
    by_key = {g["key"]: g for g in ledger.digests}
    for ev in truth.events:
        for recipient, did, status, _reason, stream in ev.outcomes:
            if stream is None or status == "suppressed":
                continue
            holder = streams.get((stream, ev.event_id))
            found = None if holder is None else by_key.get(holder)
            if found is None or found["delivery_id"] != did:
                where = "no digest" if found is None else f"digest delivery {found['delivery_id']}"
                bad(
                    did,
                    f"event {ev.event_id} for {recipient} was given to digest delivery {did} "
                    f"of stream {stream}, but {where} holds it",
                )
    return out


def _off_at(flips: Sequence[FlipRecord], at: float) -> bool:
    """Whether these flips (one scope) certainly had the recipient opted out at ``at``:
    the last flip that returned before ``at`` is an opt-out, and the next one had not
    begun by then."""
    ordered = sorted(flips, key=lambda f: f.started)
    for i, f in enumerate(ordered):
        if f.committed is None or f.committed >= at - STORE_EPSILON:
            continue
        later = ordered[i + 1 :]
        if later and later[0].committed is not None and later[0].committed < at - STORE_EPSILON:
            continue  # a later flip rules
        if f.off and (not later or later[0].started > at + STORE_EPSILON):
            return True
    return False


def _opted_out(ledger: Ledger, truth: GroundTruth) -> list[Violation]:
    """``opted_out_unsent``: opted out before the first claim → never leased, never sent."""
    if ledger.claims is None or not truth.flips:
        return []
    first: dict[int, dict[str, Any]] = {}
    for c in ledger.claims:
        if c["delivery_id"] not in first or c["at"] < first[c["delivery_id"]]["at"]:
            first[c["delivery_id"]] = c
    out = []
    for d in ledger.deliveries:
        claim = first.get(d["id"])
        if claim is None or d["type"] is None or d["recipient_id"] is None:
            continue
        at = float(claim["at"]) - BASE
        scopes: dict[str | None, list[FlipRecord]] = {}
        for f in truth.flips:
            if f.recipient == d["recipient_id"] and (
                f.type is None or (f.type == d["type"] and f.channel == d["channel"])
            ):
                scopes.setdefault(f.type, []).append(f)
        off = [scope for scope, flips in scopes.items() if _off_at(flips, at)]
        if not off:
            continue
        sent = [r for r in truth.requests if r.key == d["idempotency_key"]]
        got = sum(1 for _, counted in truth.effects.get(d["idempotency_key"], []) if counted)
        what = "everything" if off[0] is None else f"{off[0]}:{d['channel']}"
        out.append(
            Violation(
                name="opted_out_unsent",
                delivery=d["id"],
                detail=f"{d['recipient_id']} opted out of {what} before t={at:.3f}, when "
                f"{claim['worker_id']} first claimed job {claim['job_id']}; status={d['status']}, "
                f"{len(sent)} request(s), received {got}",
            )
        )
    return out


def verdicts(
    ledger: Ledger,
    truth: GroundTruth,
    waiting: Collection[int] = (),
    in_commit: Collection[str] = (),
) -> Tally:
    """The run's notifications judged in ``kirim.chaos``'s words: what the ledger
    reports of each, against what its providers made of its key (a bounced message
    too: the provider accepted it) and the most copies its user got in one epoch
    between the operator's retries; the doubt is that of the attempts since the
    operator's last retry. ``waiting``: deliveries whose jobs wait far ahead for a
    send window, not judged; ``in_commit``: channels whose effect is written in the
    finish's own commit (the inbox), whose uncommitted attempts are no doubt (as in
    ``check``)."""
    jobs = {j["delivery_id"]: j for j in ledger.jobs}
    attempts: dict[int, list[dict[str, Any]]] = {}
    for a in ledger.attempts:
        attempts.setdefault(a["delivery_id"], []).append(a)
    reports, made, copies = [], {}, {}
    for d in ledger.deliveries:
        if d["id"] in waiting:
            continue
        key = d["idempotency_key"]
        epochs = truth.epochs(key, d["id"])
        made[key] = _made(truth, key, epochs)
        copies[key] = max(epochs)
        reports.append(_report(d, jobs.get(d["id"]), attempts.get(d["id"], []), in_commit))
    return tally(reports, made, copies)


def _report(
    d: dict[str, Any],
    job: dict[str, Any] | None,
    attempts: Sequence[dict[str, Any]],
    in_commit: Collection[str] = (),
) -> Report:
    """A ledger row's report (``kirim.chaos.report_of`` on plain SQL rows)."""
    status, doubt = d["status"], d["doubt"]
    since = d["released_at"] or 0.0
    doubtful = any(
        a["status"] in DOUBTFUL
        and a["requested_at"] >= since
        and (a.get("provider") or d["channel"]) not in in_commit
        for a in attempts
    )
    succeeded = any(a["status"] == "succeeded" for a in attempts)
    resolved = (status == "sent" and doubt == "resolved") or status in ("delivered", "bounced")
    return Report(
        key=d["idempotency_key"],
        created_at=float(d["created_at"]),
        unfinished=status in ("pending", "processing"),
        failed=status in ("failed", "canceled"),
        canceled=status == "canceled",
        denied=status == "suppressed",
        in_doubt=status == "in_doubt" or doubt in ("assumed_sent", "held"),
        unresolved=doubtful and not (succeeded or resolved),
        resolved=resolved,
        retries=0 if job is None else max(0, int(job["attempts"]) - 1),
        dead=job is not None and job["status"] == "dead",
    )
