"""The digest step of workflows, written once for both backends (``kirim_run_digests``,
``kirim_run_digest_members``; the step: ``kirim.notify.steps.Digest``;
docs/workflows.md#a-digest-step).

A *stream* is one (type, recipient, value of the step's key, and the run's
cancellation value if its type has ``cancel_on``: ``runs.digest_stream``).
A run reaching the step joins its stream's open window (``arrive``): the one whose
end is still ahead, else a new one starting now (a window ended but not sealed yet is
sealed first, so that at most one window of a stream is open: the partial UNIQUE
index ``kirim_run_digests_open`` makes two arrivals of one instant, in two
transactions, find one window). The run waits, its cursor on the step, until the
window's end.

The first member to resume after the end seals the window (``settle``): under the
window's lock, the holder is its oldest member not canceled (``standing``) and the
window keeps those members' events (event id and data, oldest first), once. The
holder goes on (``gathered``) and its later sends are rendered with the events; each
other member ends ``joined``, naming the holder.

A cancellation takes the run's lock, then its window's (``cancel_check``): before the
seal, the run is canceled and the seal, which reads the members' statuses under the
same lock, leaves it out; after it, a member other than the holder has been gathered
already (too late: nothing changed), and the holder's cancellation cancels the digest.

Lock order: the runs (all of a transaction's, in id order), then the window, then
the deliveries.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kirim.errors import StoreError
from kirim.keys import canonical_json
from kirim.notify.steps import Digest
from kirim.runs import Run, RunStatus, digest_stream
from kirim.store.sequence import Operation, Query


@dataclass(frozen=True, slots=True, kw_only=True)
class Gather:
    """What a run at its digest step is to do: ``wait`` until ``until``, or the window
    is sealed: ``holder`` (None: every member was canceled) and its ``events``."""

    wait: bool
    until: float | None = None
    holder: int | None = None
    events: tuple[Mapping[str, Any], ...] = ()


def at_step(run: Run, step: Digest, now: float) -> Operation[Gather]:
    """The run at its digest step: joins its window (once), waits for its end, then
    finds it sealed (or seals it)."""
    rows = yield Query("run_digest_member", {"run_id": run.id})
    if not rows:
        stream = digest_stream(run.type, run.recipient_id, _value(run, step))
        window = yield from _open(stream, step.window, now)
        yield Query(
            "join_run_digest",
            {
                "run_id": run.id,
                "stream": stream,
                "window_start": window["window_start"],
                "now": now,
            },
            count=True,
        )
        return Gather(wait=True, until=float(window["window_end"]))
    member = rows[0]
    if member["sealed_at"] is None:
        end = float(member["window_end"])
        if now < end:
            return Gather(wait=True, until=end)
        [member] = yield Query(
            "lock_run_digest",
            {"stream": member["stream"], "window_start": member["window_start"]},
        )
        if member["sealed_at"] is None:
            member = yield from _seal(member, now)
    holder = member["holder_run_id"]
    return Gather(
        wait=False,
        holder=None if holder is None else int(holder),
        events=tuple(json.loads(member["events"] or "[]")),
    )


def events_of(run_id: int) -> Operation[tuple[Mapping[str, Any], ...]]:
    """The events of the sealed window ``run_id`` holds (a later send renders them)."""
    rows = yield Query("run_digest_member", {"run_id": run_id})
    if not rows or rows[0]["sealed_at"] is None:
        raise StoreError(f"run {run_id}: its digest window is not sealed; try again")
    return tuple(json.loads(rows[0]["events"] or "[]"))


def cancel_check(run: Run) -> Operation[str | None]:
    """Before a cancellation of ``run`` (locked): lock its window, if it joined one;
    why it is too late to cancel it (its window sealed, another run holds it: it was
    gathered into that one's digest already), else None."""
    if run.status is not RunStatus.WAITING:
        return None
    if run.unreadable is None and not any(isinstance(s, Digest) for s in run.steps):
        return None  # no digest step: never a member (a newer kirim's steps: look)
    rows = yield Query("run_digest_member", {"run_id": run.id})
    if not rows:
        return None
    [window] = yield Query(
        "lock_run_digest", {"stream": rows[0]["stream"], "window_start": rows[0]["window_start"]}
    )
    if window["sealed_at"] is None:
        return None  # the seal, under this lock after us, leaves it out
    holder = window["holder_run_id"]
    if holder is not None and int(holder) == run.id:
        return None  # the holder's cancellation cancels the digest
    return f"gathered into the digest of run {holder} already: too late to cancel"


def _value(run: Run, step: Digest) -> str:
    """The run's value of the step's key (empty for ``"recipient"``), with its
    cancellation value when it has one (a type's ``cancel_on``): a window never mixes
    runs that one cancelling event would not cancel all of, so the holder's
    cancellation by an event takes only a digest whose every member it cancels."""
    value = "" if step.key == "recipient" else run.data.get(step.key)
    text = "" if value is None else str(value)
    if run.cancel_value is None:
        return text
    return canonical_json([text, run.cancel_value])


def _open(stream: str, window: float, now: float) -> Operation[Mapping[str, Any]]:
    """The stream's open window (locked), a new one from ``now`` when none is open or
    the open one has ended (it is sealed first)."""
    for _ in range(3):
        rows = yield Query("lock_open_run_digest", {"stream": stream})
        if rows:
            found: Mapping[str, Any] = rows[0]
            if now < float(found["window_end"]):
                return found
            yield from _seal(found, now)
        made = yield Query(
            "open_run_digest",
            {"stream": stream, "start": now, "end": now + window, "now": now},
        )
        if made:
            opened: Mapping[str, Any] = made[0]
            return opened
        # another transaction opened one meanwhile (its insert was waited for): take it
    raise StoreError(f"digest stream {stream}: no window could be opened; try again")


def standing(members: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The members a seal gathers: those not canceled, oldest first (the explorer's
    mutation check counts the canceled too: ``tests/explore/test_flows.py``)."""
    return [m for m in members if m["status"] != str(RunStatus.CANCELED)]


def _seal(window: Mapping[str, Any], now: float) -> Operation[Mapping[str, Any]]:
    """Seal a window (locked by the caller): its holder and its events, once."""
    key = {"stream": window["stream"], "window_start": window["window_start"]}
    members = yield Query("run_digest_members", key)
    kept = standing(members)
    events = [
        {"run_id": int(m["run_id"]), "event_id": str(m["event_id"]), "data": json.loads(m["data"])}
        for m in kept
    ]
    holder = int(kept[0]["run_id"]) if kept else None
    text = canonical_json(events)
    yield Query(
        "seal_run_digest", {**key, "holder": holder, "events": text, "now": now}, count=True
    )
    return {**window, "holder_run_id": holder, "events": text, "sealed_at": now}


__all__ = ["Gather", "at_step", "cancel_check", "events_of", "standing"]
