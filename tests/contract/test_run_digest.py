"""The digest step of workflows on both backends: the runs of one recipient (and key)
reaching the step within a window are gathered into the oldest, whose later send is
rendered with every event once; the others end ``joined``; a late run opens the next
window; a cancellation before the seal leaves its run out, after it is too late for a
member the digest gathered, and cancels the digest when it is the holder's; a delay
before the digest sends one digest, not one per run (Novu #1633); two events of one
instant make one window (Novu #2569)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.errors import ConfigError, InvalidNotification
from kirim.notify import messages
from kirim.notify.types import parse_type
from kirim.runs import RenderGathered, RunStatus, StepOutcome, timeline
from kirim.testing import FlakyProvider, ManualClock
from kirim.worker import WorkerSettings
from kirim.workflows import canceled_json

SETTINGS = WorkerSettings(lease=30.0, backoff_base=1.0, backoff_max=1.0)


def _type(*, key: str = "recipient", delay: bool = False, name: str = "gather") -> object:
    steps: list[dict[str, object]] = []
    if delay:
        steps.append({"delay": "10m"})
    steps += [{"digest": {"window": "1h", "key": key}}, {"send": "email"}]
    return parse_type(
        name,
        {
            "templates": {
                "email": {
                    "subject": "{{ count }} comments",
                    "body": "{% for e in events %}{{ e.text }};{% endfor %}",
                }
            },
            "cancel_on": ["post_deleted"],
            "cancel_key": "post",
            "steps": steps,
        },
    )


@pytest.fixture
def email() -> FlakyProvider:
    return FlakyProvider()


@pytest.fixture
async def app(database_url: str, clock: ManualClock, email: FlakyProvider) -> AsyncIterator[Kirim]:
    channels = {"email": Channel(name="email", provider=email)}
    types = [_type(), _type(key="post", name="by_post"), _type(delay=True, name="later")]
    kirim = Kirim(Config(database=database_url), channels=channels, clock=clock, types=types)  # type: ignore[list-item]
    await kirim.open(migrate=True)
    yield kirim
    await kirim.close()


async def drain(app: Kirim) -> None:
    worker = app.worker(settings=SETTINGS)
    while await worker.run_once():
        pass


async def _event(app: Kirim, n: int, *, type: str = "gather", post: str = "p1") -> int:
    done = await app.notify_event(
        type, ["u1"], {"text": f"c{n}", "post": post}, event_id=f"{type}-{n}"
    )
    return done.runs[0].run_id


def _render(app: Kirim) -> RenderGathered:
    return messages.run_renderer(app.types, app.config.max_payload_bytes)


def _sent(email: FlakyProvider) -> list[dict[str, object]]:
    return [
        json.loads(m.payload) if isinstance(m.payload, str) else dict(m.payload)
        for m in email.requests
    ]  # type: ignore[arg-type]


async def test_one_window_one_send_with_every_event(
    app: Kirim, clock: ManualClock, email: FlakyProvider
) -> None:
    """Three events within the hour: one email with the three, sent by the oldest run;
    the two others end joined, naming it; a fourth after the hour opens the next."""
    runs = [await _event(app, 1)]
    clock.advance(60)
    runs.append(await _event(app, 2))
    await drain(app)
    clock.advance(60)
    runs.append(await _event(app, 3))
    await drain(app)
    assert email.requests == []  # the window is open
    clock.advance(3600)
    late = await _event(app, 4)  # after the window's end: the next window
    await drain(app)
    assert len(email.requests) == 1
    (payload,) = _sent(email)
    assert payload["subject"] == "3 comments"
    assert payload["body"] == "c1;c2;c3;"
    assert payload["count"] == 3
    holder, *others = [await app.must_get_run(r) for r in runs]
    assert holder.status is RunStatus.DONE
    assert [s.outcome for s in holder.recorded] == [StepOutcome.GATHERED, StepOutcome.SENT]
    assert holder.recorded[0].why == "3 events"
    for run in others:
        assert run.status is RunStatus.DONE
        assert [(s.outcome, s.why) for s in run.recorded] == [
            (StepOutcome.JOINED, f"run {holder.id}")
        ]
        assert timeline(run)[0]["state"] == "joined"
    waiting = await app.must_get_run(late)
    assert waiting.status is RunStatus.WAITING
    assert waiting.cursor == 0
    clock.advance(3601)
    await drain(app)
    assert [p["body"] for p in _sent(email)] == ["c1;c2;c3;", "c4;"]


async def test_two_events_of_one_instant_make_one_window(
    app: Kirim, clock: ManualClock, email: FlakyProvider
) -> None:
    """Two events of the same instant, advanced in one batch: one window, one send."""
    await _event(app, 1)
    await _event(app, 2)
    await drain(app)
    clock.advance(3601)
    await drain(app)
    assert [p["count"] for p in _sent(email)] == [2]


async def test_a_delay_before_the_digest_sends_it_once(
    app: Kirim, clock: ManualClock, email: FlakyProvider
) -> None:
    """Each run waits its delay first; they reach the digest within the hour: one send."""
    for n in range(3):
        await _event(app, n, type="later")
        clock.advance(30)
    await drain(app)
    for _ in range(4):
        clock.advance(1200)
        await drain(app)
    assert [p["count"] for p in _sent(email)] == [3]


async def test_a_key_makes_one_window_per_value(
    app: Kirim, clock: ManualClock, email: FlakyProvider
) -> None:
    """key = "post": the events of two posts make two digests; the field is required."""
    await _event(app, 1, type="by_post", post="p1")
    await _event(app, 2, type="by_post", post="p2")
    await _event(app, 3, type="by_post", post="p1")
    await drain(app)
    clock.advance(3601)
    await drain(app)
    assert sorted(p["body"] for p in _sent(email)) == ["c1;c3;", "c2;"]
    with pytest.raises(InvalidNotification, match="post"):
        await app.notify_event("by_post", ["u1"], {"text": "x"}, event_id="nokey")


async def test_cancel_before_the_seal_leaves_the_run_out(
    app: Kirim, clock: ManualClock, email: FlakyProvider
) -> None:
    """The oldest run canceled during the window: the next oldest holds the digest,
    without the canceled run's event."""
    first = await _event(app, 1)
    second = await _event(app, 2)
    await _event(app, 3)
    await drain(app)
    done = await app.cancel_run(first)
    assert done.changed
    clock.advance(3601)
    await drain(app)
    assert [p["body"] for p in _sent(email)] == ["c2;c3;"]
    holder = await app.must_get_run(second)
    assert holder.recorded[0].outcome is StepOutcome.GATHERED


async def test_cancel_after_the_seal(app: Kirim, clock: ManualClock, email: FlakyProvider) -> None:
    """After the seal, a member gathered into another's digest is too late to cancel
    (changed False, it ends joined); the holder's cancellation cancels the digest."""
    runs = [await _event(app, n) for n in range(3)]
    await drain(app)
    clock.advance(3601)
    # the seal, by the first run to resume; then nothing more
    claims = await app.store.claim_runs(worker_id="w", now=clock.now(), lease=30, limit=1)
    assert [c.run.id for c in claims] == [runs[0]]
    await app.store.advance_run(
        claims[0].run.id, claims[0].token, now=clock.now(), render=_render(app)
    )
    late = await app.cancel_run(runs[2])
    assert not late.changed
    assert late.too_late == f"gathered into the digest of run {runs[0]} already: too late to cancel"
    assert canceled_json(late)["too_late"] == late.too_late
    assert (await app.must_get_run(runs[2])).status is RunStatus.WAITING
    await drain(app)
    assert (await app.must_get_run(runs[2])).recorded[0].outcome is StepOutcome.JOINED
    assert [p["count"] for p in _sent(email)] == [3]


async def test_the_holders_cancel_after_the_seal_cancels_the_digest(
    app: Kirim, clock: ManualClock, email: FlakyProvider
) -> None:
    """The window sealed by a member that is not the holder (the holder's claim was
    elsewhere); the holder canceled then: nothing is sent, the others end joined."""
    runs = [await _event(app, n) for n in range(2)]
    await drain(app)
    clock.advance(3601)
    claims = await app.store.claim_runs(worker_id="w", now=clock.now(), lease=30, limit=2)
    by_id = {c.run.id: c for c in claims}
    second = by_id[runs[1]]
    await app.store.advance_run(second.run.id, second.token, now=clock.now())  # seals: joined
    done = await app.cancel_run(runs[0])
    assert done.changed
    clock.advance(60)
    await drain(app)
    assert email.requests == []
    assert (await app.must_get_run(runs[0])).status is RunStatus.CANCELED
    assert (await app.must_get_run(runs[1])).recorded[0].outcome is StepOutcome.JOINED


async def test_a_cancelling_event_never_takes_another_values_events(
    app: Kirim, clock: ManualClock, email: FlakyProvider
) -> None:
    """A digest by recipient of a type cancelled by post: the runs of each post gather
    apart (a window holds one cancel_key value), so the event that deletes post p1,
    after the seal, cancels p1's digest and never drops the comments of p2."""
    p1 = [await _event(app, 1, post="p1"), await _event(app, 3, post="p1")]
    p2 = [await _event(app, 2, post="p2")]
    await drain(app)
    clock.advance(3601)
    claims = await app.store.claim_runs(worker_id="w", now=clock.now(), lease=30, limit=5)
    by_id = {c.run.id: c for c in claims}
    joiner = by_id[p1[1]]
    await app.store.advance_run(joiner.run.id, joiner.token, now=clock.now())  # seals p1's
    canceled = await app.cancel_by_event("post_deleted", {"post": "p1"})
    assert {c.run.id for c in canceled if c.changed} == {p1[0]}  # the holder: the digest
    clock.advance(60)
    await drain(app)
    assert [p["body"] for p in _sent(email)] == ["c2;"]
    assert (await app.must_get_run(p2[0])).status is RunStatus.DONE


async def test_a_retried_advance_gathers_once(
    app: Kirim, clock: ManualClock, email: FlakyProvider
) -> None:
    """An event given again, a worker whose claim expired: the digest is still one
    send of each event once (Novu #12373)."""
    runs = [await _event(app, n) for n in range(2)]
    await _event(app, 0)  # given again: the same run
    await drain(app)
    clock.advance(3601)
    claims = await app.store.claim_runs(worker_id="w", now=clock.now(), lease=30, limit=2)
    assert sorted(c.run.id for c in claims) == sorted(runs)
    clock.advance(31)  # the claims expire unused; another worker takes them
    await drain(app)
    stale = await app.store.advance_run(claims[0].run.id, claims[0].token, now=clock.now())
    assert stale is None
    await drain(app)
    assert [p["body"] for p in _sent(email)] == ["c0;c1;"]


def test_the_config_is_checked() -> None:
    """At most one digest, a send after it, a window of 1 s to 31 days."""
    base = {"templates": {"email": {"body": "b"}}}
    cases = {
        "at most one digest": [{"digest": "1h"}, {"digest": "2h"}, {"send": "email"}],
        "needs a send step after it": [{"send": "email"}, {"digest": "1h"}],
        "from 1 to 2678400, not 0": [{"digest": "0s"}, {"send": "email"}],
        "from 1 to 2678400, not 2764800": [{"digest": "32d"}, {"send": "email"}],
        "unknown key": [{"digest": {"window": "1h", "every": 2}}, {"send": "email"}],
    }
    for match, steps in cases.items():
        with pytest.raises(ConfigError, match=match):
            parse_type("t", {**base, "steps": steps})
    t = parse_type("t", {**base, "steps": [{"digest": "90s"}, {"send": "email"}]})
    assert t.steps[0].to_json() == {
        "kind": "digest",
        "window": 90.0,
        "key": "recipient",
        "name": "digest0",
    }


async def test_prune_takes_the_members_with_their_runs_and_the_empty_windows(
    app: Kirim, clock: ManualClock, email: FlakyProvider, database_url: str
) -> None:
    """Once every run of a window is over and pruned, its memberships and the window
    go; an open window with a waiting member stays."""
    from test_run_retention import count

    for n in range(4):  # two windows of two
        await _event(app, n)
        await drain(app)
        if n % 2:
            clock.advance(3601)
            await drain(app)
    open_run = await _event(app, 9)
    await drain(app)
    assert count(database_url, "kirim_run_digests") == 3
    clock.advance(86_400 * 40)  # the sends' deliveries at rest long ago
    would = await app.store.prune(  # type: ignore[attr-defined]
        now=clock.now(), keep=60.0, keys=86_400.0 * 365, limit=500, dry_run=True
    )
    done = await app.store.prune(  # type: ignore[attr-defined]
        now=clock.now(), keep=60.0, keys=86_400.0 * 365, limit=500, dry_run=False
    )
    # the first window's two runs go (the second's holder keeps the newest delivery)
    assert done.runs == 3
    # the first window goes with them, and the result says so; --dry-run counts it too,
    # at most, as it counts the runs (here the second window's holder, whose newest
    # delivery stays, is counted as going: so is its window)
    assert done.run_digests == 1
    assert done.as_dict()["run_digests"] == 1
    assert (would.runs, would.run_digests) == (4, 2)
    assert count(database_url, "kirim_run_digest_members") == 2
    assert count(database_url, "kirim_run_digests") == 2
    assert (await app.must_get_run(open_run)).status is RunStatus.WAITING


async def test_run_show_names_the_digest(
    app: Kirim, clock: ManualClock, email: FlakyProvider, database_url: str
) -> None:
    """``kirim run show``: the holder's step reads ``gathered (2 events)``, a member's
    ``joined run R``, a run in an open window ``waits`` until its end."""
    from kirim.cli.runs import _line

    runs = [await _event(app, n) for n in range(2)]
    await drain(app)
    waiting = timeline(await app.must_get_run(runs[0]))[0]
    assert waiting["state"] == "waits"
    assert "in a digest window until" in _line(waiting)
    clock.advance(3601)
    await drain(app)
    holder, member = [timeline(await app.must_get_run(r))[0] for r in runs]
    assert "gathered (2 events)" in _line(holder)
    assert f"joined run {runs[0]}" in _line(member)


async def test_postgres_two_arrivals_of_one_instant_find_one_window(
    app: Kirim, clock: ManualClock, email: FlakyProvider, database_url: str
) -> None:
    """PostgreSQL: a run reaching the step while another transaction opens its
    stream's window (not committed yet) waits for it, then joins that window instead
    of opening a second (Novu #2569)."""
    if not database_url.startswith("postgresql:"):
        pytest.skip("concurrent transactions: PostgreSQL only (SQLite serialises writers)")
    import asyncio

    import psycopg

    from kirim.keys import canonical_json
    from kirim.runs import digest_stream

    first = await _event(app, 1)
    second = await _event(app, 2)
    stream = digest_stream("gather", "u1", canonical_json(["", "p1"]))  # post p1's runs
    other = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    watcher = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    async with other, watcher:
        async with other.transaction():  # the first run's advance, not committed yet
            await other.execute("SELECT 1 FROM kirim_runs WHERE id = %s FOR UPDATE", (first,))
            await other.execute(
                "INSERT INTO kirim_run_digests (stream, window_start, window_end, created_at)"
                " VALUES (%s, %s, %s, %s)",
                (stream, clock.now(), clock.now() + 3600, clock.now()),
            )
            await other.execute(
                "INSERT INTO kirim_run_digest_members VALUES (%s, %s, %s, %s)",
                (first, stream, clock.now(), clock.now()),
            )
            claims = await app.store.claim_runs(worker_id="w", now=clock.now(), lease=30, limit=2)
            mine = next(c for c in claims if c.run.id == second)
            advancing = asyncio.ensure_future(
                app.store.advance_run(mine.run.id, mine.token, now=clock.now() + 1)
            )
            for _ in range(200):  # until its insert waits on the other's window row
                cur = await watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE 'INSERT INTO kirim_run_digests%%'"
                )
                row = await cur.fetchone()
                if row is not None and row[0]:
                    break
                await asyncio.sleep(0.01)
            else:
                pytest.fail("the second arrival did not wait for the first's window")
            assert not advancing.done()
        await asyncio.wait_for(advancing, timeout=10)
    assert count_windows(database_url) == 1
    clock.advance(3602)
    await drain(app)
    assert [p["count"] for p in _sent(email)] == [2]


def count_windows(url: str) -> int:
    from test_run_retention import count

    return count(url, "kirim_run_digests")


async def test_a_holder_advanced_without_its_types_templates_is_set_aside(
    app: Kirim, clock: ManualClock, email: FlakyProvider
) -> None:
    """An advance that cannot render the holder's send (no ``render``: a worker that
    does not know the type) makes no delivery: the run is looked at again 10 minutes
    later, and a worker that knows the type sends the digest then."""
    runs = [await _event(app, n) for n in range(2)]
    await drain(app)
    clock.advance(3601)
    for c in await app.store.claim_runs(worker_id="old", now=clock.now(), lease=30, limit=5):
        await app.store.advance_run(c.run.id, c.token, now=clock.now())
    holder = await app.must_get_run(runs[0])
    assert holder.status is RunStatus.WAITING
    assert holder.cursor == 1
    assert "not known to this worker" in (holder.why or "")
    await drain(app)
    assert email.requests == []
    clock.advance(601)
    await drain(app)
    assert [p["count"] for p in _sent(email)] == [2]


async def test_a_digest_too_large_to_send_is_skipped_with_why(
    database_url: str, clock: ManualClock, email: FlakyProvider
) -> None:
    """A holder's send rendering over ``max_payload_bytes`` is recorded ``skipped``
    with why; the run ends, nothing is sent."""
    channels = {"email": Channel(name="email", provider=email)}
    config = Config(database=database_url, max_payload_bytes=400)
    app = Kirim(config, channels=channels, clock=clock, types=[_type()])  # type: ignore[list-item]
    await app.open(migrate=True)
    try:
        runs = [await _event(app, n) for n in range(30)]
        await drain(app)
        clock.advance(3601)
        await drain(app)
        holder = await app.must_get_run(runs[0])
        assert holder.status is RunStatus.DONE
        assert [s.outcome for s in holder.recorded] == [StepOutcome.GATHERED, StepOutcome.SKIPPED]
        assert "over the limit of 400" in holder.recorded[1].why
        assert email.requests == []
    finally:
        await app.close()
