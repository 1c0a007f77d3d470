"""The workflow workload (``kirim.explore.flows``): its invariants hold over its
seeds, it reaches what it claims to draw, and a run that skips the branch record is
caught within 200 seeds."""

from __future__ import annotations

import os
from collections import Counter

import pytest

import kirim.store.flows
from kirim.explore import flows
from kirim.explore.flows import FLOW_KNOBS, FlowWorld

BUDGET = range(int(os.environ.get("KIRIM_FLOWS_BUDGET", "60")))


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
