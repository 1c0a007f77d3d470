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
  reported as certain (``failed``, or ``sent`` with no doubt and no success);
- ``one_provider_in_doubt``: after an attempt to a provider that may have arrived
  (it ends ``requested`` or ``unknown``), no later attempt of the delivery goes to
  another provider (failover only after a definite non-acceptance), within an epoch.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kirim.explore.provider import GroundTruth

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
)
DEFINITE = ("failed_transient", "failed_permanent")
DOUBTFUL = ("requested", "unknown")
EPSILON = 1e-9


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
    audit: list[dict[str, Any]] | None  # None: no audit trigger (PostgreSQL lane)

    @staticmethod
    def read_sqlite(path: str) -> Ledger:
        conn = sqlite3.connect(path)
        conn.row_factory = sqlite3.Row
        try:

            def rows(sql: str) -> list[dict[str, Any]]:
                return [dict(r) for r in conn.execute(sql).fetchall()]

            return Ledger(
                deliveries=rows("SELECT * FROM kirim_deliveries ORDER BY id"),
                attempts=rows("SELECT * FROM kirim_attempts ORDER BY id"),
                jobs=rows("SELECT * FROM kirim_jobs ORDER BY id"),
                audit=rows("SELECT * FROM explore_intent_audit"),
            )
        finally:
            conn.close()


def check(
    ledger: Ledger,
    truth: GroundTruth,
    *,
    at_least_once: bool,
    quiet: bool,
) -> list[Violation]:
    """Every violated invariant (``quiet``: the run reached quiescence in its bounds)."""
    out: list[Violation] = []
    by_key = {d["idempotency_key"]: d for d in ledger.deliveries}
    attempts: dict[int, list[dict[str, Any]]] = {}
    for a in ledger.attempts:
        attempts.setdefault(a["delivery_id"], []).append(a)
    for d in ledger.deliveries:
        out.extend(_delivery(d, attempts.get(d["id"], []), truth, at_least_once))
    out.extend(_requests(ledger, truth, by_key))
    active = [j for j in ledger.jobs if j["status"] in ("queued", "running", "retry_scheduled")]
    if not quiet or active or truth.in_flight:
        unfinished = [
            d["id"] for d in ledger.deliveries if d["status"] in ("pending", "processing")
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
    d: dict[str, Any], attempts: Sequence[dict[str, Any]], truth: GroundTruth, at_least_once: bool
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
    if status == "sent" and doubt in (None, "resolved") and sum(epochs) == 0:
        out.append(Violation(name="certain_sent", delivery=did, detail=shown))
    if (status == "failed" or (status == "canceled" and doubt is None)) and got > 0:
        out.append(Violation(name="certain_unsent", delivery=did, detail=shown))
    since = d["released_at"] or 0.0
    statuses = [a["status"] for a in attempts if a["requested_at"] >= since]
    if status == "sent" and got == 0 and statuses and all(s in DEFINITE for s in statuses):
        out.append(
            Violation(
                name="lost_as_sent",
                delivery=did,
                detail=f"{shown}; every attempt definitely failed: {statuses}",
            )
        )
    out.extend(_one_provider(did, [a for a in attempts if a["requested_at"] >= since]))
    open_doubt = [a for a in attempts if a["status"] in DOUBTFUL and a["requested_at"] >= since]
    succeeded = any(a["status"] == "succeeded" for a in attempts)
    certain = status == "failed" or (status == "sent" and doubt is None and not succeeded)
    if open_doubt and certain:
        out.append(
            Violation(
                name="unreported_doubt",
                delivery=did,
                detail=f"{shown}; {len(open_doubt)} attempt(s) may have arrived",
            )
        )
    return out


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
