"""The digest step's worlds of the flows workload (``kirim.explore.flows``: a world
whose ``digest`` knob is drawn plays here): events for one recipient spread over time
(some after a window's end, some of one instant, some behind a delay step), workers
that hold their claims while a cancellation races the seal (before it, or after it),
workers that crash holding claims, and cancellations by event and by an operator; the
promise checked against the windows the store kept and what the provider was asked:

- ``digest_one_holder``: a sealed window has at most one ``gathered`` run, its holder
  (exactly one unless its holder was canceled after the seal), and each other member
  ended ``joined``, naming it;
- ``digest_once``: each send step after the digest reached the provider at most once
  per window, with the window's events (``count``, the event ids) and nothing else;
- ``digest_events``: each member's event is in exactly one sealed window, its own,
  once, unless its run was canceled before that window's seal (then in none), and a
  run canceled before the seal never holds it;
- ``digest_windows``: the windows of a stream never overlap, each member arrived
  within its window, and a window's members share their cancellation value (a
  cancelling event that cancels its holder cancels them all);
- ``digest_made``: the holder of a sealed window, once done, made each send step
  after the digest (never a digest dropped silently);
- ``digest_liveness``: once time has passed every window's end and the workers ran,
  no run waits at its digest step.

The world's clock moves a millisecond after every action, so a cancellation and a
seal are never of one instant: which came first is read from their times.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kirim.model import OnUnknown
from kirim.notify import messages
from kirim.notify.steps import Digest, Send
from kirim.notify.types import NotificationType, parse_type
from kirim.runs import Run, RunClaim, RunStatus, StepOutcome, step_key

if TYPE_CHECKING:
    from kirim.engine import Kirim
    from kirim.explore.flows import Clock, FlowWorld, Outcome, Provider

#: a digest world's windows (seconds)
WINDOWS = (60.0, 3600.0)
#: what a digest world does, one action at a time
DIGEST_ACTIONS = (
    "event",
    "event",
    "event",
    "same_instant",
    "wait",
    "wait",
    "tick",
    "hold",
    "release",
    "cancel_run",
    "cancel_event",
    "crash",
)
POSTS = ("p1", "p2")
LEASE = 30.0


def draw(rng: random.Random) -> dict[str, Any]:
    """A digest world's own values (``FlowWorld.digest``)."""
    actions = [[rng.choice(DIGEST_ACTIONS), rng.randrange(8)] for _ in range(rng.randint(4, 18))]
    if rng.random() < 0.5:  # a cancellation racing the seal, forced: claims held around it
        at = rng.randrange(len(actions) + 1)
        actions[at:at] = [
            ["wait", 7],
            ["hold", 0],
            ["cancel_run", rng.randrange(8)],
            ["release", 0],
        ]
    return {
        "window": rng.choice(WINDOWS),
        "keyed": rng.random() < 0.5,
        "delay_first": rng.random() < 0.3,
        "actions": actions,
    }


def digest_type(spec: Mapping[str, Any]) -> NotificationType:
    steps: list[dict[str, Any]] = []
    if spec["delay_first"]:
        steps.append({"delay": 30})
    key = "post" if spec["keyed"] else "recipient"
    steps += [{"digest": {"window": spec["window"], "key": key}}, {"send": "email"}]
    return parse_type(
        "flow",
        {
            "templates": {
                "email": {
                    "title": "{{ count }}",
                    "body": "{% for e in events %}{{ e.n }},{% endfor %}",
                }
            },
            "cancel_on": ["order_done"],
            "cancel_key": "post",
            "steps": steps,
        },
    )


async def play(
    app: Kirim, clock: Clock, world: FlowWorld, email: Provider, url: str, out: Outcome
) -> None:
    """Play the digest world ``world`` and check it into ``out``."""
    from kirim.explore.flows import _sql

    spec = world.digest
    assert spec is not None
    window = float(spec["window"])
    render = messages.run_renderer(app.types, app.config.max_payload_bytes)
    workers = [app.worker(settings=_settings(), worker_id=f"w{k}") for k in range(2)]
    runs: list[int] = []
    #: (store time, run id, changed) of each cancellation
    cancels: list[tuple[float, int, bool]] = []
    held: list[RunClaim] = []
    n = 0

    async def event() -> None:
        nonlocal n
        post = POSTS[n % 2] if n % 3 else POSTS[0]
        done = await app.notify_event("flow", ["u0"], {"post": post, "n": n}, event_id=f"e{n}")
        runs.append(done.runs[0].run_id)
        n += 1

    for step, (kind, arg) in enumerate(spec["actions"]):
        if kind == "event":
            await event()
        elif kind == "same_instant":
            await event()
            await event()
        elif kind == "wait":  # up to one and a half windows; 7: just past the end
            clock.t += window + 1 if arg == 7 else window * arg / 5
        elif kind == "tick":
            await workers[step % 2].run_once()
        elif kind == "hold":  # a worker claims the due runs and sits on them
            held += await app.store.claim_runs(
                worker_id="holder", now=clock.now(), lease=LEASE, limit=50
            )
        elif kind == "release":
            for claim in held:
                await app.store.advance_run(
                    claim.run.id, claim.token, now=clock.now(), render=render
                )
            held = []
        elif kind == "crash":  # claimed, then the worker is gone: the leases expire
            await app.store.claim_runs(worker_id="crashed", now=clock.now(), lease=LEASE, limit=50)
        elif kind == "cancel_run" and runs:
            rid = runs[arg % len(runs)]
            done = await app.cancel_run(rid, why="operator")
            cancels.append((clock.now(), rid, done.changed))
        elif kind == "cancel_event" and runs:
            post = POSTS[arg % 2]
            for gone in await app.cancel_by_event("order_done", {"post": post}):
                cancels.append((clock.now(), gone.run.id, gone.changed))
        clock.t += 0.001
    for _ in range(6):  # time enough to settle: every window ends, every lease expires
        clock.t += window + LEASE + 40
        for w in workers:
            await w.run_once()
            await w.run_once()
    found = {r: await app.must_get_run(r) for r in runs}
    windows = {
        (str(s), float(ws)): {
            "end": float(we),
            "holder": None if h is None else int(h),
            "sealed_at": None if sa is None else float(sa),
            "events": json.loads(ev) if ev else [],
        }
        for s, ws, we, h, sa, ev in _sql(
            url,
            "SELECT stream, window_start, window_end, holder_run_id, sealed_at, events "
            "FROM kirim_run_digests",
            (),
        )
    }
    members = {
        int(r): (str(s), float(ws), float(at))
        for r, s, ws, at in _sql(
            url, "SELECT run_id, stream, window_start, created_at FROM kirim_run_digest_members", ()
        )
    }
    out.runs = len(found)
    _check(world, found, windows, members, cancels, email, out)


def _settings() -> Any:
    from kirim.explore.flows import SETTINGS

    return SETTINGS


def _check(
    world: FlowWorld,
    runs: Mapping[int, Run],
    windows: Mapping[tuple[str, float], Mapping[str, Any]],
    members: Mapping[int, tuple[str, float, float]],
    cancels: list[tuple[float, int, bool]],
    email: Provider,
    out: Outcome,
) -> None:
    v = out.violations
    changed_at: dict[int, float] = {}
    for when, rid, changed in cancels:
        if changed:
            changed_at.setdefault(rid, when)
        else:
            out.reached.add("digest:cancel_unchanged")
    gathered_by: dict[int, int] = {}  # run id -> gathered count
    for rid, run in runs.items():
        index = next(i for i, s in enumerate(run.steps) if isinstance(s, Digest))
        rec = {s.index: s for s in run.recorded}
        at = rec.get(index)
        if at is not None:
            out.reached.add(f"digest:{at.outcome}")
            if at.outcome is StepOutcome.GATHERED:
                gathered_by[rid] = 1
        if run.status is RunStatus.WAITING and run.cursor == index:
            v.append(f"digest_liveness: run {rid} still waits at its digest step")
        if rid not in members:
            if at is not None:
                v.append(f"digest_events: run {rid} recorded {at.outcome} without a window")
            continue
        stream, start, arrived = members[rid]
        w = windows.get((stream, start))
        if w is None:
            v.append(f"digest_windows: run {rid}'s window is gone")
            continue
        if not start <= arrived < w["end"]:
            v.append(
                f"digest_windows: run {rid} arrived at {arrived}, its window {start}-{w['end']}"
            )
        canceled = changed_at.get(rid)
        sealed = w["sealed_at"]
        before_seal = canceled is not None and (sealed is None or canceled < sealed)
        ids = [e["event_id"] for win in windows.values() for e in win["events"]]
        mine = [e["event_id"] for e in w["events"]]
        if before_seal:
            out.reached.add("digest:cancel_before_seal")
            if run.event_id in ids:
                v.append(f"digest_events: run {rid} canceled before the seal, its event gathered")
            if w["holder"] == rid:
                v.append(f"digest_events: run {rid} canceled before the seal holds the window")
            continue
        if sealed is None:
            continue  # waits: liveness has said so
        if ids.count(run.event_id) != 1 or mine.count(run.event_id) != 1:
            v.append(
                f"digest_events: run {rid}'s event {run.event_id} is in "
                f"{ids.count(run.event_id)} windows' events, {mine.count(run.event_id)} in its own"
            )
        if canceled is not None:
            out.reached.add("digest:holder_canceled" if w["holder"] == rid else "digest:late")
        if w["holder"] != rid and run.status is not RunStatus.CANCELED:
            if at is None or at.outcome is not StepOutcome.JOINED:
                v.append(f"digest_one_holder: run {rid} of window held by {w['holder']} not joined")
            elif at.why != f"run {w['holder']}":
                v.append(f"digest_one_holder: run {rid} joined {at.why!r}, held by {w['holder']}")
            if run.status is not RunStatus.DONE:
                v.append(f"digest_one_holder: run {rid} joined but {run.status}")
    by_window: dict[tuple[str, float], list[int]] = {}
    for rid, (stream, start, _) in members.items():
        by_window.setdefault((stream, start), []).append(rid)
    streams: dict[str, list[tuple[float, float]]] = {}
    for (stream, start), w in windows.items():
        streams.setdefault(stream, []).append((start, w["end"]))
        ids = by_window.get((stream, start), [])
        holders = [r for r in ids if r in gathered_by]
        if len(holders) > 1:
            v.append(f"digest_one_holder: window {start} has {len(holders)} gathered runs")
        h = w["holder"]
        if w["sealed_at"] is not None and h is not None:
            hr = runs.get(h)
            if hr is not None and hr.status is not RunStatus.CANCELED and holders != [h]:
                v.append(f"digest_one_holder: window {start} held by {h}, gathered: {holders}")
        values = {runs[r].cancel_value for r in ids if r in runs}
        if len(values) > 1:
            shown = sorted(str(x) for x in values)
            v.append(f"digest_windows: window {start} gathers runs of cancel values {shown}")
        if w["sealed_at"] is not None and h is not None:
            _check_made(runs.get(h), v)
        _check_sends(world, runs, ids, w, email, v)
    for spans in streams.values():
        spans.sort()
        for (s1, e1), (s2, _) in itertools.pairwise(spans):
            if s2 < e1:
                v.append(f"digest_windows: windows {s1}-{e1} and {s2} overlap")
    if len(windows) > 1:
        out.reached.add("digest:windows")


def _check_made(holder: Run | None, v: list[str]) -> None:
    """``digest_made``: the holder of a sealed window, once done (not canceled), made
    each send step after the digest (a digest is never dropped silently)."""
    if holder is None or holder.status is not RunStatus.DONE:
        return
    digest = next(i for i, s in enumerate(holder.steps) if isinstance(s, Digest))
    rec = {s.index: s for s in holder.recorded}
    for i, step in enumerate(holder.steps):
        if i > digest and isinstance(step, Send):
            r = rec.get(i)
            if r is None or r.outcome is not StepOutcome.SENT:
                got = "nothing" if r is None else f"{r.outcome} ({r.why})"
                v.append(f"digest_made: holder run {holder.id} step {i} recorded {got}")


def _check_sends(
    world: FlowWorld,
    runs: Mapping[int, Run],
    ids: list[int],
    w: Mapping[str, Any],
    email: Provider,
    v: list[str],
) -> None:
    """At most one send per window per send step, with the window's events."""
    per_step: dict[int, int] = {}
    for rid in ids:
        run = runs[rid]
        digest = next(i for i, s in enumerate(run.steps) if isinstance(s, Digest))
        for i, step in enumerate(run.steps):
            if i <= digest or not isinstance(step, Send):
                continue
            got = email.received.get(step_key(run.key, i, step.channel), 0)
            if got > 1 and world.on_unknown is not OnUnknown.RETRY:  # retry: at least once
                v.append(f"digest_once: run {rid} step {i} reached the user {got} times")
            if got:
                per_step[i] = per_step.get(i, 0) + 1
    for i, count in per_step.items():
        if count > 1:
            v.append(f"digest_once: one window's step {i} was sent by {count} runs")
    events = [e["event_id"] for e in w["events"]]
    for payload in email.payloads:
        carried = payload.get("events") or []
        if set(carried) & set(events) and (
            carried != events or payload.get("count") != len(events)
        ):
            v.append(f"digest_once: a send carried {carried}, its window {events}")


__all__ = ["DIGEST_ACTIONS", "digest_type", "draw", "play"]
