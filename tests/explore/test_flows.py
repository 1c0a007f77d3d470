"""The workflow workload (``kirim.explore.flows``): its invariants hold over its
seeds, on SQLite and on PostgreSQL (a bounded lane), it reaches what it claims to
draw, its saved worlds (tests/explore/seeds/flows/) still reach the edge each was kept
for, and a run that skips the branch record is caught within 200 seeds."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

import kirim.store.flows
from kirim.explore import flows
from kirim.explore.flows import FLOW_KNOBS, FlowWorld

BUDGET = range(int(os.environ.get("KIRIM_FLOWS_BUDGET", "60")))
#: the PostgreSQL lane's seeds (slower: a database per seed)
PG_BUDGET = range(int(os.environ.get("KIRIM_FLOWS_PG_BUDGET", "10")))
SAVED = sorted((Path(__file__).parent / "seeds" / "flows").glob("*.json"))


def test_every_flow_knob_takes_more_than_one_value() -> None:
    """Each knob the workload names takes at least two values over 200 seeds."""
    worlds = [FlowWorld.draw(seed) for seed in range(200)]
    seen = {name: {repr(read(w)) for w in worlds} for name, read in FLOW_KNOBS.items()}
    assert [name for name, values in seen.items() if len(values) < 2] == []


def test_the_invariants_hold_over_the_seeds() -> None:
    """Each step once, one path, branches decided on what the feed said, nothing sent
    after a cancellation that did not name it, every run over in the end, and prune
    takes only runs over, whose events given again start nothing."""
    results = flows.run_seeds(BUDGET)
    assert [(r.seed, r.violations) for r in results if r.violations] == []
    assert sum(r.runs for r in results) > len(results)
    assert sum(r.pruned for r in results) > 0  # an operator's prune took runs


def test_the_workload_reaches_branches_cancellations_and_crashes(tmp_path) -> None:
    """Over the seeds, runs take both ways of their branch, end done and canceled."""
    import asyncio

    from kirim.engine import Kirim

    outcomes: Counter[str] = Counter()
    original = flows._check

    async def counting(app: Kirim, world, run, providers, cancels, out) -> None:  # type: ignore[no-untyped-def]
        outcomes[str(run.status)] += 1
        outcomes.update(str(s.outcome) for s in run.recorded)
        outcomes.update("left" for _, c in cancels if c.left and c.run.id == run.id)
        await original(app, world, run, providers, cancels, out)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(flows, "_check", counting)
        for seed in range(40):
            d = tmp_path / str(seed)
            d.mkdir()
            asyncio.run(flows.run_world(FlowWorld.draw(seed), d))
    for wanted in ("done", "canceled", "then", "else", "skipped", "waited", "left"):
        assert outcomes[wanted] > 0, (wanted, outcomes)


def test_mutation_branch_record_skipped_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A branch decided but not recorded is caught within 200 seeds."""

    def skipped(*args, **kwargs):  # type: ignore[no-untyped-def]
        return True
        yield  # a generator that yields nothing

    monkeypatch.setattr(kirim.store.flows, "record_decision", skipped)
    for seed in range(200):
        (result,) = flows.run_seeds([seed])
        if any(v.startswith("one_path") for v in result.violations):
            return
    pytest.fail("the skipped branch record was not caught within 200 seeds")


def test_mutation_cancels_after_the_events_commit_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The event's cancellations in a transaction of their own, after the event's
    (as kirim did before ``kirim.store.event_writes``): caught within 200 seeds, by an
    event whose process dies between the two."""
    import kirim.engine
    from kirim.store import event_writes

    record = event_writes.record

    def split(write, given, refuse=None):  # type: ignore[no-untyped-def]
        if write.deliveries or write.runs:  # the event's own: its cancellations after
            write = replace(write, cancels=())
        return record(write, given, refuse)

    original = kirim.engine.Kirim.record_event

    async def then_cancel(self, event, **kwargs):  # type: ignore[no-untyped-def]
        result = await original(self, event, **kwargs)
        await self.cancel_by_event(event.type.name, event.data)
        return result

    monkeypatch.setattr(event_writes, "record", split)
    monkeypatch.setattr(kirim.engine.Kirim, "record_event", then_cancel)
    for seed in range(200):
        (result,) = flows.run_seeds([seed])
        if any(v.startswith("cancel_atomic") for v in result.violations):
            return
    pytest.fail("cancellations committed apart from their event were not caught in 200 seeds")


def test_mutation_until_read_without_the_dst_rule_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A delay until 02:30 read naively (a skipped time taken with the offset before
    the jump: an hour late) is caught by delay_end within 200 seeds."""
    from datetime import UTC, datetime, timedelta

    import kirim.day_time

    def naive(now: float, at: kirim.day_time.DayTime, zone_name: str) -> float:
        tz = kirim.day_time.zone(zone_name)
        today = datetime.fromtimestamp(now, UTC).astimezone(tz).date()
        days = (today + timedelta(days=n) for n in range(3))
        found = (datetime.combine(d, at.clock, tzinfo=tz).timestamp() for d in days)
        return next(t for t in found if t >= now)

    monkeypatch.setattr(kirim.day_time, "next_instant", naive)
    for seed in range(200):
        (result,) = flows.run_seeds([seed])
        if any(v.startswith("delay_end") for v in result.violations):
            return
    pytest.fail("an until-delay read without the DST rule was not caught within 200 seeds")


def test_mutation_until_in_the_wrong_zone_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """An until-delay that ignores the recipient's zone (reads UTC) is caught."""
    import kirim.day_time

    monkeypatch.setattr(kirim.day_time, "zone_of", lambda mine, step: "UTC")
    for seed in range(200):
        (result,) = flows.run_seeds([seed])
        if any(v.startswith("delay_end") for v in result.violations):
            return
    pytest.fail("an until-delay in the wrong zone was not caught within 200 seeds")


def test_the_invariants_hold_on_postgresql(pg_server: str) -> None:
    """The same worlds on PostgreSQL (a throw-away database each, copied from a
    migrated template): no violation, and the runs end as they do on SQLite."""
    results = flows.run_seeds(PG_BUDGET, database=pg_server)
    assert [(r.seed, r.violations) for r in results if r.violations] == []
    on_sqlite = flows.run_seeds(PG_BUDGET)
    assert [sorted(r.reached) for r in results] == [sorted(r.reached) for r in on_sqlite]


def test_the_mutation_is_caught_on_postgresql(
    pg_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A branch decided but not recorded is caught on PostgreSQL too, within the lane."""

    def skipped(*args, **kwargs):  # type: ignore[no-untyped-def]
        return True
        yield  # a generator that yields nothing

    monkeypatch.setattr(kirim.store.flows, "record_decision", skipped)
    results = flows.run_seeds(PG_BUDGET, database=pg_server)
    assert any(v.startswith("one_path") for r in results for v in r.violations)


def test_kirim_explore_runs_the_flows_workload_on_postgresql(pg_server: str) -> None:
    """``kirim explore --workload flows --database postgresql://…`` plays the seeds
    there and says so in its summary."""
    from kirim.explore.command import explore

    done = CliRunner().invoke(
        explore, ["--workload", "flows", "--seeds", "3", "--database", pg_server, "--json"]
    )
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == {"seeds": 3, "failed": []}
    nowhere = "postgresql://postgres@127.0.0.1:9/none"  # never a silent run on SQLite
    failed = CliRunner().invoke(
        explore, ["--workload", "flows", "--seeds", "1", "--database", nowhere]
    )
    assert failed.exit_code != 0


def test_flows_database_must_be_postgresql() -> None:
    """A --database that is not a PostgreSQL URL is a usage error for the flows lane."""
    from kirim.explore.command import explore

    done = CliRunner().invoke(
        explore, ["--workload", "flows", "--seeds", "1", "--database", "sqlite:///x.db"]
    )
    assert done.exit_code == 2
    assert "postgresql://" in done.output


@pytest.mark.parametrize("path", SAVED, ids=[p.stem for p in SAVED])
def test_saved_world_holds_and_reaches_its_edge(path: Path) -> None:
    """A saved world (its drawn values, so it plays the same however ``draw`` changes)
    violates nothing and still reaches what it was kept for."""
    saved = json.loads(path.read_text())
    world = FlowWorld.from_json(saved["world"])
    assert world.to_json() == saved["world"]
    assert saved["why"]
    (result,) = flows.run_worlds([world])
    assert result.violations == []
    assert set(saved["reaches"]) <= result.reached, sorted(result.reached)


def test_saved_worlds_hold_on_postgresql(pg_server: str) -> None:
    """The saved worlds on PostgreSQL: no violation, the same edges reached."""
    saved = [json.loads(p.read_text()) for p in SAVED]
    results = flows.run_worlds([FlowWorld.from_json(s["world"]) for s in saved], database=pg_server)
    for s, result in zip(saved, results, strict=True):
        assert result.violations == []
        assert set(s["reaches"]) <= result.reached


def test_there_are_saved_worlds() -> None:
    """The flows workload keeps saved worlds (a glob that finds none tests nothing)."""
    assert len(SAVED) >= 5


def test_mutation_run_tombstone_ignored_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A start that ignores a pruned run's tombstone (its event given again starts a
    second run) is caught by prune_replay within 60 seeds."""
    from kirim.store.sqlite import driver

    kept = "WHERE NOT EXISTS (SELECT 1 FROM kirim_run_tombstones WHERE key = :key)"
    assert kept in driver.Q["insert_run"]
    monkeypatch.setitem(driver.Q, "insert_run", driver.Q["insert_run"].replace(kept, "WHERE true"))
    for seed in range(60):
        (result,) = flows.run_seeds([seed])
        if any(v.startswith("prune_replay") for v in result.violations):
            return
    pytest.fail("a pruned run started again was not caught within 60 seeds")


def test_mutation_runs_pruned_while_waiting_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prune that takes runs (and their deliveries) that are not over is caught by
    prune_over within 60 seeds."""
    from kirim.store import retention_records
    from kirim.store.sqlite import driver

    over = "WHERE r.next_at IS NULL AND r.status IN ('done', 'canceled') AND"
    guard = "AND (r.status = 'waiting' OR r.next_at IS NOT NULL)"
    assert over in driver.Q["prune_run_candidates"]
    assert guard in driver.Q["prune_candidates"]
    monkeypatch.setitem(
        driver.Q, "prune_run_candidates", driver.Q["prune_run_candidates"].replace(over, "WHERE")
    )
    monkeypatch.setitem(
        driver.Q, "prune_candidates", driver.Q["prune_candidates"].replace(guard, "AND false")
    )
    monkeypatch.setitem(
        driver.Q,
        "prune_write_run_tombstones",
        driver.Q["prune_write_run_tombstones"].replace("u.value ->> 'status'", "'done'"),
    )
    monkeypatch.setattr(retention_records, "over", lambda run: True)
    for seed in range(60):
        (result,) = flows.run_seeds([seed])
        if any(v.startswith("prune_over") for v in result.violations):
            return
    pytest.fail("a run pruned while not over was not caught within 60 seeds")


def test_mutation_unreadable_run_fails_the_claim_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A claim that fails on a run a newer kirim recorded (instead of setting it aside)
    starves every run: caught within 60 seeds."""

    def fails(row, why, now):  # type: ignore[no-untyped-def]
        raise kirim.store.flows.UnreadableStep(why)
        yield  # a generator

    monkeypatch.setattr(kirim.store.flows, "_set_aside", fails)
    for seed in range(60):
        (result,) = flows.run_seeds([seed])
        if any(v.startswith(("liveness", "set_aside")) for v in result.violations):
            return
    pytest.fail("a claim failing on an unreadable run was not caught within 60 seeds")


def test_mutation_reads_raise_on_an_unreadable_run_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An operator's read that raises on a run a newer kirim recorded (as ``kirim run
    show|list`` did) is caught within 60 seeds."""
    strict = kirim.store.flows.run_from

    def raising(row, *, lenient=False):  # type: ignore[no-untyped-def]
        return strict(row)

    monkeypatch.setattr(kirim.store.flows, "run_from", raising)
    for seed in range(60):
        (result,) = flows.run_seeds([seed])
        if any(v.startswith("set_aside: an operator's read") for v in result.violations):
            return
    pytest.fail("a read raising on an unreadable run was not caught within 60 seeds")


def test_mutation_topic_event_cancels_nothing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """An event to a topic that cancels nothing (as before ``event_writes.topic_event``)
    is caught within 200 seeds, by one recorded by a process that dies right after."""
    from kirim.store import event_writes

    def no_cancel(record_it, cancels, given):  # type: ignore[no-untyped-def]
        return (yield from record_it)

    monkeypatch.setattr(event_writes, "topic_event", no_cancel)
    for seed in range(200):
        (result,) = flows.run_seeds([seed])
        if any("topic event" in v for v in result.violations):
            return
    pytest.fail("a topic event that cancels nothing was not caught within 200 seeds")


def test_the_digest_worlds_reach_their_edges() -> None:
    """Over the seeds, digest worlds gather and join, open later windows, and cancel
    members before the seal (left out) and after it (too late)."""
    worlds = [w for w in (FlowWorld.draw(s) for s in range(120)) if w.digest is not None]
    reached: set[str] = set()
    for result in flows.run_worlds(worlds[:30]):
        assert result.violations == [], (result.seed, result.violations)
        reached |= result.reached
    wanted = {
        "digest:gathered",
        "digest:joined",
        "digest:windows",
        "digest:cancel_before_seal",
        "digest:cancel_unchanged",
    }
    assert wanted <= reached, sorted(reached)


def _digest_mutation_caught(prefix: str) -> None:
    for seed in range(200):
        (result,) = flows.run_seeds([seed])
        if any(v.startswith(prefix) for v in result.violations):
            return
    pytest.fail(f"the digest mutation was not caught by {prefix} within 200 seeds")


def test_mutation_seal_counts_canceled_members_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A seal that counts the canceled members as holder candidates and events is
    caught within 200 seeds."""
    import kirim.store.run_digests

    monkeypatch.setattr(kirim.store.run_digests, "standing", lambda members: list(members))
    _digest_mutation_caught("digest_events")


def test_mutation_every_member_continues_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every member of a window going on as if it held it (none ``joined``) is caught
    within 200 seeds."""
    import kirim.store.run_digests

    original = kirim.store.run_digests.at_step

    def every(run, step, now):  # type: ignore[no-untyped-def]
        gather = yield from original(run, step, now)
        return gather if gather.wait else replace(gather, holder=run.id)

    monkeypatch.setattr(kirim.store.run_digests, "at_step", every)
    _digest_mutation_caught("digest_one_holder")


def test_mutation_windows_mix_cancel_values_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A digest stream without the run's cancellation value (so that a cancelling event
    for one order could take a digest that gathered another's) is caught within 200
    seeds."""
    import kirim.store.run_digests

    def key_only(run, step):  # type: ignore[no-untyped-def]
        value = "" if step.key == "recipient" else run.data.get(step.key)
        return "" if value is None else str(value)

    monkeypatch.setattr(kirim.store.run_digests, "_value", key_only)
    _digest_mutation_caught("digest_windows")


def test_mutation_holder_drops_its_digest_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder whose digest's send is not made (its render fails, and the run ends
    done: the digest dropped, as novu's #12373) is caught by ``digest_made`` within
    200 seeds."""
    import kirim.notify.messages

    def fails(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise ValueError("dropped")

    monkeypatch.setattr(kirim.notify.messages, "render_gathered", fails)
    _digest_mutation_caught("digest_made")
