"""Workflow runs, written once for both backends (``kirim_runs``, ``kirim_run_steps``;
the model and the branch rule: ``kirim.runs``; docs/workflows.md).

- ``start`` (the event's record): one run per (type, event, recipient), its key
  UNIQUE; a run given again is returned as it is (created False).
- ``claim`` (the worker): due runs, each with a lease and a fresh fencing token.
- ``advance`` (the worker, under its claim): lock the run, check the token, then take
  its steps one after the other in this one transaction, each recorded once
  (``kirim_run_steps``' primary key is the run and the step): a send step makes its
  delivery (its key ``step_key`` of the run's and the step's) and its job; a branch
  reads its step's delivery and decides (``kirim.runs.decide``); a delay, or a branch
  whose step has not settled, ends the transaction with the run due again later and
  its claim released. A worker whose claim was taken over (or whose run was canceled)
  writes nothing: the token no longer matches.
- ``cancel`` (an operator, a ``cancel_on`` event): lock the run, mark it canceled, and
  cancel each of its deliveries that may be canceled, honestly: a delivery whose
  request may have left is ``canceled (held)`` (``transitions.cancel``); one in flight
  or sent is left to settle and named in the answer.

Lock order: the run, then its deliveries (and their jobs).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kirim import day_time, runs
from kirim.errors import NotSettled, StoreError
from kirim.keys import canonical_json, payload_hash
from kirim.model import DeliveryStatus, Doubt
from kirim.notify.steps import Branch, Delay, Digest, Send, UnreadableStep, step_from_json
from kirim.runs import RenderGathered, Run, RunClaim, RunStatus, RunStep, StepOutcome, StepState
from kirim.store import recipients, run_digests, transitions
from kirim.store.retention import key_hash
from kirim.store.sequence import TIME, Operation, Query
from kirim.validation import BadValue
from kirim.views import iso

#: seconds until a branch on a step not yet settled looks again
RECHECK = 5.0
#: seconds until a run whose steps this kirim cannot read is looked at again
UNREADABLE_AGAIN = 600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class NewRun:
    """A run to start: ``messages`` maps each channel its send steps use to the
    rendered message (``recipient``: the address, ``payload``: JSON text,
    ``payload_hash``)."""

    key: str
    type: str
    event_id: str
    recipient_id: str
    steps_json: str
    data_json: str
    messages: Mapping[str, Mapping[str, str]]
    max_attempts: int
    cancel_value: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Started:
    run: Run
    created: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Advanced:
    """What one ``advance`` did: the run after it, and the steps it recorded."""

    run: Run
    recorded: tuple[RunStep, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Canceled:
    """A run's cancellation: ``canceled`` deliveries; ``held`` ones canceled though a
    request may have reached the user (``canceled (held)``); ``left``: delivery id ->
    why it was not canceled (in flight, sent, not settled yet)."""

    run: Run
    changed: bool
    canceled: tuple[int, ...] = ()
    held: tuple[int, ...] = ()
    left: Mapping[int, str] = field(default_factory=dict)
    #: why a run not over could not be canceled (a digest's member gathered already)
    too_late: str | None = None


def run_from(row: Mapping[str, Any], *, lenient: bool = False) -> Run:
    """A row of ``kirim_runs``; ``UnreadableStep`` when a step is a newer kirim's,
    unless ``lenient`` (an operator's read, a cancellation: they need no step): the run
    then has no ``steps``, its ``stored_steps`` as written and why (``unreadable``)."""
    try:
        return _run_from(row)
    except UnreadableStep as exc:
        if not lenient:
            raise
        stored = json.loads(row["steps"])
        raw = tuple(s for s in stored if isinstance(s, Mapping)) if isinstance(stored, list) else ()
        return replace(_run_from({**row, "steps": "[]"}), unreadable=str(exc), stored_steps=raw)


def _run_from(row: Mapping[str, Any]) -> Run:
    return Run(
        id=int(row["id"]),
        key=str(row["key"]),
        type=str(row["type"]),
        event_id=str(row["event_id"]),
        recipient_id=str(row["recipient_id"]),
        status=RunStatus(row["status"]),
        cursor=int(row["cursor"]),
        next_at=None if row["next_at"] is None else float(row["next_at"]),
        steps=tuple(step_from_json(s) for s in json.loads(row["steps"])),
        data=json.loads(row["data"]),
        cancel_value=row["cancel_value"],
        why=row["why"],
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
        claim_token=row["claim_token"],
        claimed_by=row["claimed_by"],
        claim_expires_at=None
        if row["claim_expires_at"] is None
        else float(row["claim_expires_at"]),
    )


def _step_from(row: Mapping[str, Any]) -> RunStep:
    status = row["delivery_status"]
    doubt = row["delivery_doubt"]
    return RunStep(
        index=int(row["idx"]),
        outcome=StepOutcome(row["outcome"]),
        why=str(row["why"]),
        at=float(row["created_at"]),
        delivery_id=None if row["delivery_id"] is None else int(row["delivery_id"]),
        until=None if row["until_at"] is None else float(row["until_at"]),
        delivery_status=None if status is None else DeliveryStatus(status),
        delivery_doubt=None if doubt is None else Doubt(doubt),
    )


# -- start ----------------------------------------------------------------------------


def start(items: Sequence[NewRun], given: float) -> Operation[list[Started]]:
    """Start each run, once per key (in key order: the lock order of concurrent
    starts)."""
    at = yield TIME
    now = at(given)
    out: dict[int, Started] = {}
    for i in sorted(range(len(items)), key=lambda i: items[i].key):
        item = items[i]
        rows = yield Query(
            "insert_run",
            {
                "key": item.key,
                "type": item.type,
                "event_id": item.event_id,
                "recipient_id": item.recipient_id,
                "steps": item.steps_json,
                "data": item.data_json,
                "messages": canonical_json(dict(item.messages)),
                "max_attempts": item.max_attempts,
                "cancel_value": item.cancel_value,
                "now": now,
            },
        )
        if rows:
            # PostgreSQL: an insert that waited on the key of a run a prune deleted
            # meanwhile is undone here, where the prune's tombstone is seen
            twin = yield Query(
                "drop_pruned_run_twin", {"id": rows[0]["id"], "key": item.key}, optional=True
            )
            if not twin:
                out[i] = Started(run=run_from(rows[0], lenient=True), created=True)
                continue
        [row] = yield Query("run_by_key", {"key": item.key})
        out[i] = Started(run=run_from(row, lenient=True), created=False)
    if any(s.created for s in out.values()):
        yield Query("notify", optional=True)
    return [out[i] for i in range(len(items))]


# -- claim and advance (the worker) ------------------------------------------------------


def claim(worker_id: str, given: float, lease: float, limit: int) -> Operation[list[RunClaim]]:
    """Claim up to ``limit`` due runs, each with a lease and a fresh token."""
    at = yield TIME
    now = at(given)
    rows = yield Query(
        "claim_runs",
        {
            "token": uuid.uuid4().hex,
            "worker": worker_id,
            "now": now,
            "lease": lease,
            "limit": limit,
        },
    )
    found: list[Run] = []
    for r in rows:
        try:
            found.append(run_from(r))
        except UnreadableStep as exc:  # a newer kirim's run: left for a newer worker
            yield from _set_aside(r, str(exc), now)
    found.sort(key=lambda r: r.id)
    return [RunClaim(run=r, token=str(r.claim_token)) for r in found]


def _set_aside(row: Mapping[str, Any], why: str, now: float) -> Operation[None]:
    """A claimed run whose steps this kirim cannot read: its claim released, its next
    look ``UNREADABLE_AGAIN`` later (so it never crowds the readable ones out of a
    batch), and why, for an operator; a newer worker takes it then."""
    why = f"{why} (left for a newer kirim)"[:500]
    released = _release(int(row["id"]), int(row["cursor"]), RunStatus(row["status"]), why, now)
    yield Query("update_run", {**released, "next_at": now + UNREADABLE_AGAIN}, count=True)


def advance(
    run_id: int, token: str, given: float, render: RenderGathered | None = None
) -> Operation[Advanced | None]:
    """Take the run's due steps under the claim ``token``; None: the claim no longer
    holds (nothing written). ``render``: a gathered run's later sends, rendered with
    its digest's events (``kirim.runs.RenderGathered``; None: such a run is set aside
    until a worker that has it takes it)."""
    rows = yield Query("lock_run", {"id": run_id})
    at = yield TIME  # after the lock
    now = at(given)
    if not rows:
        return None
    row = rows[0]
    run = run_from(row)
    if run.claim_token != token or run.status is RunStatus.DONE:
        return None
    if run.status is RunStatus.CANCELED:  # back to cancel what had not settled
        _c, _h, _left, again = yield from _cancel_deliveries(run_id, now)
        update = _released(run, RunStatus.CANCELED, run.why, now)
        update["next_at"] = now + RECHECK if again else None
        yield Query("update_run", update, count=True)
        return Advanced(run=replace(run, next_at=update["next_at"], claim_token=None), recorded=())
    messages: Mapping[str, Mapping[str, str]] = json.loads(row["messages"])
    done = yield Query("run_steps", {"run_id": run_id})
    deliveries = {int(r["idx"]): r["delivery_id"] for r in done}
    recorded: list[RunStep] = []
    cursor = run.cursor
    next_at: float | None = now
    status = RunStatus.WAITING

    def record(index: int, outcome: StepOutcome, why: str, **more: Any) -> Operation[None]:
        args = {"delivery_id": None, "until_at": None, **more}
        if outcome in (StepOutcome.THEN, StepOutcome.ELSE):
            inserted = yield from record_decision(run_id, index, outcome, why, now)
        else:
            inserted = yield from _insert_step(run_id, index, outcome, why, now, args)
        if not inserted:  # recorded before: a fenced writer cannot get here
            raise StoreError(f"run {run_id}: step {index} was recorded already; try again")
        recorded.append(
            RunStep(
                index=index,
                outcome=outcome,
                why=why,
                at=now,
                delivery_id=args["delivery_id"],
                until=args["until_at"],
            )
        )

    why_now = run.why
    gathered = next(
        (int(r["idx"]) for r in done if r["outcome"] == str(StepOutcome.GATHERED)), None
    )
    events: tuple[Mapping[str, Any], ...] | None = None
    while True:
        if cursor >= len(run.steps):
            status, next_at = RunStatus.DONE, None
            break
        step = run.steps[cursor]
        if isinstance(step, Digest):
            gather = yield from run_digests.at_step(run, step, now)
            if gather.wait:
                next_at = gather.until
                why_now = f"in a digest window until {iso(gather.until)}"
                break
            if gather.holder != run.id:
                yield from record(cursor, StepOutcome.JOINED, f"run {gather.holder}")
                cursor += 1
                status, next_at = RunStatus.DONE, None
                break
            events = gather.events
            gathered, why_now = cursor, None
            yield from record(cursor, StepOutcome.GATHERED, f"{len(events)} events")
            cursor += 1
            continue
        if isinstance(step, Send):
            message = messages[step.channel]
            if gathered is not None and gathered < cursor:  # rendered with the digest's events
                if events is None:
                    events = yield from run_digests.events_of(run.id)
                payload = None
                try:
                    payload = None if render is None else render(run, step.channel, message, events)
                except Exception as exc:  # the render's failure: the step is not sent
                    why = f"the digest could not be rendered: {exc}"[:500]
                    yield from record(cursor, StepOutcome.SKIPPED, why)
                    cursor += 1
                    continue
                if payload is None:  # a worker that does not know the type: one that does
                    next_at = now + UNREADABLE_AGAIN
                    why_now = f"type {run.type} is not known to this worker (left for one)"
                    break
                message = {**message, "payload": payload, "payload_hash": payload_hash(payload)}
            delivery_id = yield from _make_delivery(run, cursor, step, message, row, now)
            deliveries[cursor] = delivery_id
            yield from record(
                cursor, StepOutcome.SENT, f"delivery {delivery_id}", delivery_id=delivery_id
            )
            cursor += 1
            continue
        if isinstance(step, Delay):
            until, why = yield from _delay_end(run, step, now)
            yield from record(cursor, StepOutcome.WAITED, why, until_at=until)
            cursor += 1
            next_at = until
            if until > now:
                break
            continue
        decision = yield from _decide(run, step, deliveries)
        if decision.taken is None:
            next_at = now + RECHECK
            break
        if decision.taken:
            yield from record(cursor, StepOutcome.THEN, decision.why)
            cursor += 1
            continue
        yield from record(cursor, StepOutcome.ELSE, decision.why)
        target = _index_of(run, step.otherwise)
        for skipped in range(cursor + 1, target):
            yield from record(skipped, StepOutcome.SKIPPED, f"branch {step.name} was false")
        cursor = target
    runs.check(run_id, str(run.status), str(status), "advance")
    run_why = why_now if status is RunStatus.WAITING else _ended(recorded)
    yield Query(
        "update_run",
        {
            "id": run_id,
            "status": str(status),
            "cursor": cursor,
            "next_at": next_at,
            "why": run_why,
            "claim_token": None,
            "claimed_by": None,
            "claim_expires_at": None,
            "now": now,
        },
        count=True,
    )
    after = replace(
        run,
        status=status,
        why=run_why,
        cursor=cursor,
        next_at=next_at,
        claim_token=None,
        claimed_by=None,
        claim_expires_at=None,
        updated_at=now,
    )
    return Advanced(run=after, recorded=tuple(recorded))


def _ended(recorded: Sequence[RunStep]) -> str:
    if recorded and recorded[-1].outcome is StepOutcome.JOINED:
        return f"gathered into the digest of {recorded[-1].why}"
    return "past its last step"


def lock_runs(run_ids: Sequence[int]) -> Operation[None]:
    """Lock every run of a transaction first, in id order, before any digest window
    (the lock order: the runs, then the windows, then the deliveries; SQLite, whose
    write lock is the transaction's, has no such query)."""
    yield Query("lock_runs", {"ids": sorted(set(run_ids))}, optional=True)


def advance_many(
    claims: Sequence[tuple[int, str]], given: float, render: RenderGathered | None = None
) -> Operation[list[Advanced | None]]:
    """``advance`` of each (run id, token), in one transaction, in run id order (the
    lock order of every writer of runs: a cancellation takes them so too; every run
    locked before the first digest window); the answers in the order given."""
    done: dict[int, Advanced | None] = {}
    if len(claims) > 1:
        yield from lock_runs([run_id for run_id, _ in claims])
    for i in sorted(range(len(claims)), key=lambda i: claims[i][0]):
        run_id, token = claims[i]
        done[i] = yield from advance(run_id, token, given, render)
    return [done[i] for i in range(len(claims))]


def _delay_end(run: Run, step: Delay, now: float) -> Operation[tuple[float, str]]:
    """When a delay that starts ``now`` ends, and its why: computed once, recorded
    with the step (``until_at``), so the run's ``next_at`` never moves after; an
    until-delay reads the recipient's time zone (their preferences'), else the step's,
    else UTC (``kirim.day_time``)."""
    if step.until is None:
        return now + step.seconds, f"{step.seconds:g}s"
    prefs = yield from recipients.preferences_of([run.recipient_id])
    mine = prefs.get(run.recipient_id)
    zone = day_time.zone_of(None if mine is None else mine.timezone, step.zone)
    at = day_time.DayTime.parse(step.until)
    try:
        until = day_time.next_instant(now, at, zone)
    except BadValue:  # a zone this host's tz database no longer knows: the step's
        zone = day_time.zone_of(None, step.zone)
        until = day_time.next_instant(now, at, zone)
    return until, day_time.until_why(at, zone)


def _insert_step(
    run_id: int, index: int, outcome: StepOutcome, why: str, now: float, args: Mapping[str, Any]
) -> Operation[bool]:
    inserted = yield Query(
        "insert_run_step",
        {"run_id": run_id, "idx": index, "outcome": outcome, "why": why, "now": now, **args},
    )
    return bool(inserted)


def record_decision(
    run_id: int, index: int, outcome: StepOutcome, why: str, now: float
) -> Operation[bool]:
    """A branch's decision, recorded once, in the transaction that checked the claim
    (the explorer's mutation check skips it: ``tests/explore/test_flows.py``)."""
    args = {"delivery_id": None, "until_at": None}
    return (yield from _insert_step(run_id, index, outcome, why, now, args))


def _index_of(run: Run, name: str | None) -> int:
    if name is None:
        return len(run.steps)
    return next(i for i, s in enumerate(run.steps) if s.name == name)


def _make_delivery(
    run: Run,
    index: int,
    step: Send,
    message: Mapping[str, str],
    row: Mapping[str, Any],
    now: float,
) -> Operation[int]:
    """The delivery of send step ``index`` and its job, due now; one already there
    (its key taken) is used as it is."""
    key = runs.step_key(run.key, index, step.channel)
    rows = yield Query(
        "insert_digest_delivery",
        {
            "key": key,
            "key_hash": key_hash(key),
            "event_id": run.event_id,
            "recipient": message["recipient"],
            "channel": step.channel,
            "payload": message["payload"],
            "payload_hash": message["payload_hash"],
            "type": run.type,
            "recipient_id": run.recipient_id,
            "now": now,
        },
    )
    if not rows:
        found = yield Query("digest_delivery", {"key": key})
        if not found:
            return 0  # its key tombstone is kept: the delivery was made and pruned
        return int(found[0]["id"])
    delivery_id = int(rows[0]["id"])
    yield (
        Query(
            "insert_digest_job",
            {
                "delivery_id": delivery_id,
                "run_at": now,
                "max_attempts": int(row["max_attempts"]),
                "now": now,
            },
        ),
        Query("notify", optional=True),
    )
    return delivery_id


def _decide(run: Run, step: Branch, deliveries: Mapping[int, Any]) -> Operation[runs.Decision]:
    if step.condition == "data":
        return runs.decide(step, run.data, None)
    index = _index_of(run, step.step)
    delivery_id = deliveries.get(index)
    state = StepState(status=None)
    if delivery_id:
        rows = yield Query("step_delivery_state", {"id": int(delivery_id)})
        if rows:
            r = rows[0]
            state = StepState(
                status=DeliveryStatus(r["status"]),
                doubt=None if r["doubt"] is None else Doubt(r["doubt"]),
                in_feed=r["feed_id"] is not None,
                read=r["read_at"] is not None,
                seen=r["seen_at"] is not None or r["read_at"] is not None,
            )
    return runs.decide(step, run.data, state)


# -- cancel ----------------------------------------------------------------------------


def cancel(run_id: int, why: str, given: float) -> Operation[Canceled | None]:
    """Cancel a run and every delivery of its steps that may be canceled; None: no
    such run. A run over already is returned as it is (``changed`` False)."""
    rows = yield Query("lock_run", {"id": run_id})
    at = yield TIME
    now = at(given)
    if not rows:
        return None
    run = run_from(rows[0], lenient=True)
    if run.status is RunStatus.CANCELED:
        return Canceled(run=run, changed=False)
    late = yield from run_digests.cancel_check(run)
    if late is not None:  # gathered into another run's digest already
        return Canceled(run=run, changed=False, too_late=late)
    if run.status is RunStatus.DONE:  # every step taken: its last deliveries may not have gone
        canceled, held, left, again = yield from _cancel_deliveries(run_id, now)
        if not (canceled or held or again):
            return Canceled(run=run, changed=False, left=left)
    runs.check(run_id, str(run.status), str(RunStatus.CANCELED), "cancel")
    yield Query("update_run", _released(run, RunStatus.CANCELED, why, now), count=True)
    if run.status is RunStatus.WAITING:
        canceled, held, left, again = yield from _cancel_deliveries(run_id, now)
    if again:  # some may still be sent (not settled, in flight): cancel them once they settle
        yield Query(
            "update_run",
            {**_released(run, RunStatus.CANCELED, why, now), "next_at": now + RECHECK},
            count=True,
        )
    after = replace(
        run,
        status=RunStatus.CANCELED,
        next_at=now + RECHECK if again else None,
        why=why,
        claim_token=None,
        claimed_by=None,
        claim_expires_at=None,
        updated_at=now,
    )
    return Canceled(run=after, changed=True, canceled=tuple(canceled), held=tuple(held), left=left)


def _released(run: Run, status: RunStatus, why: str | None, now: float) -> dict[str, Any]:
    return _release(run.id, run.cursor, status, why, now)


def _release(
    run_id: int, cursor: int, status: RunStatus, why: str | None, now: float
) -> dict[str, Any]:
    """``update_run``'s arguments for a run left at ``cursor`` in ``status``, its claim
    released and nothing due."""
    return {
        "id": run_id,
        "status": str(status),
        "cursor": cursor,
        "next_at": None,
        "why": why,
        "claim_token": None,
        "claimed_by": None,
        "claim_expires_at": None,
        "now": now,
    }


def _cancel_deliveries(
    run_id: int, now: float
) -> Operation[tuple[list[int], list[int], dict[int, str], bool]]:
    """Cancel each delivery of a canceled run's steps that may be: the canceled, the
    held, the others with why, and whether one may still be sent (a request not
    settled, one in flight, a retry due): then the run comes back to cancel it."""
    steps = yield Query("run_steps", {"run_id": run_id})
    canceled: list[int] = []
    held: list[int] = []
    left: dict[int, str] = {}
    again = False
    for s in steps:
        if s["delivery_id"] is None or not int(s["delivery_id"]):
            continue
        delivery_id = int(s["delivery_id"])
        if s["delivery_status"] == str(DeliveryStatus.CANCELED):
            continue
        try:
            done = yield from transitions.cancel(delivery_id, now)
        except NotSettled:
            left[delivery_id] = "an earlier request is not settled yet: canceled once it is"
            again = True
            continue
        if not done:
            status = s["delivery_status"]
            if status in (str(DeliveryStatus.PENDING), str(DeliveryStatus.PROCESSING)):
                left[delivery_id] = f"{status}: in flight, it may reach the user; canceled after"
                again = True
            else:
                left[delivery_id] = f"{status}: at rest, not canceled"
            continue
        [state] = yield Query("step_delivery_state", {"id": delivery_id})
        (held if state["doubt"] == str(Doubt.HELD) else canceled).append(delivery_id)
    return canceled, held, left, again


def to_cancel(type: str, value: str) -> Operation[list[int]]:
    """The waiting runs of ``type`` whose cancellation value is ``value``."""
    rows = yield Query("runs_to_cancel", {"type": type, "value": value})
    return [int(r["id"]) for r in rows]


# -- reads ------------------------------------------------------------------------------


def get(run_id: int) -> Operation[Run | None]:
    """A run with its recorded steps (and what their deliveries are now)."""
    rows, steps = yield (
        Query("run_by_id", {"id": run_id}),
        Query("run_steps", {"run_id": run_id}),
    )
    if not rows:
        return None
    run = run_from(rows[0], lenient=True)
    return replace(
        run,
        recorded=tuple(_step_from(s) for s in steps),
    )


def list_runs(status: RunStatus | None, limit: int) -> Operation[list[Run]]:
    rows = yield Query(
        "list_runs", {"status": None if status is None else str(status), "limit": limit}
    )
    return [run_from(r, lenient=True) for r in rows]


def counts() -> Operation[dict[str, int]]:
    rows = yield Query("run_counts")
    return {str(r["status"]): int(r["n"]) for r in rows}


__all__ = [
    "Advanced",
    "Canceled",
    "NewRun",
    "Started",
    "advance",
    "cancel",
    "claim",
    "counts",
    "get",
    "list_runs",
    "start",
    "to_cancel",
]
