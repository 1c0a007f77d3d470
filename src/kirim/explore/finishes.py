"""``finish_by_claim``: a stale worker's finish never writes the delivery.

A finish writes an attempt's outcome and, where the worker's claim still holds, the
delivery's status and the job. A late answer is still a fact: a stale worker's
outcome is recorded, but the delivery is not its to move. PostgreSQL's plain finish
is one statement whose token checks are that fence (``transitions.finish_fenced``),
so the explorer checks what the transactions wrote, from two audit triggers the
PostgreSQL lane installs (``FINISH_AUDIT_SQL``):

- ``explore_release_audit``: each move of a delivery out of ``processing``, with the
  claim it ends (``OLD.claim_token``, ``OLD.claimed_by``) and ``txid_current()``;
- ``explore_outcome_audit``: each attempt outcome written (a status change of an
  attempt), with the attempt's worker and ``txid_current()``.

A non-success outcome written in the transaction that moved its delivery out of
``processing`` must be the outcome of the worker whose claim that move ended. A
success is exempt: a success recorded by any attempt outranks a failure, and a late
one marks the delivery sent whoever held it (``rules.sent_late``; docs/design.md,
step 6: "a stale token is rejected, but the attempt's own outcome is still
written"). A finish with no attempt (nothing was sent) leaves
no outcome here and is not judged.

On SQLite the same triggers (``SQLITE_FINISH_AUDIT_SQL``) name the transaction by
``explore_tx()``, a function each of the schedule's connections is given
(``Transactions``): SQLite has nothing like ``txid_current()``, and a trigger sees
neither ``BEGIN`` nor ``COMMIT``. The explorer's loop runs each SQLite transaction
whole within one step (``BEGIN`` to ``COMMIT`` in one call), one at a time, so
counting the ``BEGIN`` statements of every connection numbers them. There the plain
finish is fenced statements too (``transitions.finish_fenced_first``: all of a batch
or none), and the rest the careful way (``transitions.finish``, the Python fence both
lanes share, which PostgreSQL takes for what its statement leaves).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from kirim.explore.invariants import Ledger, Violation

FINISH_AUDIT_SQL = """
CREATE TABLE explore_release_audit (
    delivery_id bigint, claim_token text, claimed_by text, status text, tx bigint,
    doubt text);
CREATE FUNCTION explore_release_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO explore_release_audit
    VALUES (NEW.id, OLD.claim_token, OLD.claimed_by, NEW.status, txid_current(), NEW.doubt);
    RETURN NEW;
END $$;
CREATE TRIGGER explore_release_audit AFTER UPDATE ON kirim_deliveries
FOR EACH ROW WHEN (OLD.status = 'processing' AND NEW.status <> 'processing')
EXECUTE FUNCTION explore_release_audit();
CREATE TABLE explore_outcome_audit (
    delivery_id bigint, provider_request_id text, worker_id text, status text, tx bigint);
CREATE FUNCTION explore_outcome_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO explore_outcome_audit
    VALUES (NEW.delivery_id, NEW.provider_request_id, NEW.worker_id, NEW.status,
            txid_current());
    RETURN NEW;
END $$;
CREATE TRIGGER explore_outcome_audit AFTER UPDATE OF status ON kirim_attempts
FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status)
EXECUTE FUNCTION explore_outcome_audit();
"""


#: the same audits on SQLite (``explore_tx()``: ``Transactions``)
SQLITE_FINISH_AUDIT_SQL = """
CREATE TABLE explore_release_audit (
    delivery_id INTEGER, claim_token TEXT, claimed_by TEXT, status TEXT, tx INTEGER,
    doubt TEXT);
CREATE TRIGGER explore_release_audit AFTER UPDATE ON kirim_deliveries
WHEN OLD.status = 'processing' AND NEW.status <> 'processing' BEGIN
    INSERT INTO explore_release_audit
    VALUES (NEW.id, OLD.claim_token, OLD.claimed_by, NEW.status, explore_tx(), NEW.doubt);
END;
CREATE TABLE explore_outcome_audit (
    delivery_id INTEGER, provider_request_id TEXT, worker_id TEXT, status TEXT, tx INTEGER);
CREATE TRIGGER explore_outcome_audit AFTER UPDATE OF status ON kirim_attempts
WHEN NEW.status IS NOT OLD.status BEGIN
    INSERT INTO explore_outcome_audit
    VALUES (NEW.delivery_id, NEW.provider_request_id, NEW.worker_id, NEW.status, explore_tx());
END;
"""


class Transactions:
    """Numbers the transactions of a schedule's SQLite connections for the audits
    (``explore_tx()``: the count of ``BEGIN`` statements so far, over every connection
    watched; each transaction runs whole within one step of the explorer's loop)."""

    def __init__(self) -> None:
        self.count = 0

    def watch(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        conn.create_function("explore_tx", 0, lambda: self.count)
        conn.set_trace_callback(self._statement)
        return conn

    def _statement(self, sql: str) -> None:
        if sql.startswith("BEGIN"):
            self.count += 1


def check_finish_by_claim(ledger: Ledger) -> list[Violation]:
    """Each non-success outcome written in the transaction that moved its delivery out
    of ``processing`` is that of the worker whose claim the move ended (nothing to
    judge without the audits)."""
    if ledger.releases is None or ledger.outcomes is None:
        return []
    moves: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in ledger.releases:
        moves.setdefault((int(r["tx"]), int(r["delivery_id"])), []).append(r)
    out = []
    for o in ledger.outcomes:
        if o["status"] == "succeeded":
            continue
        for move in moves.get((int(o["tx"]), int(o["delivery_id"])), []):
            if move["claimed_by"] == o["worker_id"]:
                continue
            out.append(
                Violation(
                    name="finish_by_claim",
                    delivery=int(o["delivery_id"]),
                    detail=f"{o['worker_id']}'s outcome {o['status']} of "
                    f"{o['provider_request_id']} was written in transaction {o['tx']}, "
                    f"which moved the delivery from processing to {move['status']}, ending "
                    f"{move['claimed_by']}'s claim: a stale finish wrote the delivery",
                )
            )
    return out
