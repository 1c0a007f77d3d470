"""Whole schedules: determinism, replay, a bounded budget, mutations, saved seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import kirim.store.sqlite
from kirim.explore.command import explore, run_seeds, settings_for
from kirim.explore.scenario import Settings, run_schedule
from kirim.explore.shrink import load, replay, save, shrink
from kirim.worker.decisions import InDoubt
from kirim.worker.delivery import Deliverer

SEEDS = sorted((Path(__file__).parent / "seeds").glob("*.json"))
UNFENCED = (
    "INSERT INTO kirim_attempts (delivery_id, job_id, number, provider_request_id, worker_id,"
    " status, requested_at, send_deadline, settles_at) SELECT u.value ->> 'delivery_id',"
    " u.value ->> 'job_id', u.value ->> 'number', u.value ->> 'request_id',"
    " u.value ->> 'worker_id', 'requested', u.value ->> 'requested_at',"
    " u.value ->> 'send_deadline', u.value ->> 'settles_at' FROM json_each(:items) AS u"
    " RETURNING provider_request_id"
)


async def never_in_doubt(self: Deliverer, *args: object) -> InDoubt:
    """The mutation: the worker skips its in-doubt check and sends."""
    return InDoubt(decision="resend_at_least_once", finish=None, warn=False)


def test_same_seed_same_trace_hash() -> None:
    """The same seed gives the same trace hash twice in a row, and other seeds differ."""
    runs = [run_schedule(settings_for(seed, "mix")) for seed in (3, 3, 4)]
    assert runs[0].digest == runs[1].digest
    assert runs[0].choices == runs[1].choices
    assert runs[0].digest != runs[2].digest


def test_a_recorded_run_replays_exactly_from_its_file(tmp_path: Path) -> None:
    """A schedule saved to a file replays with the same trace hash."""
    outcome = run_schedule(Settings.draw(11, provider="lookup"))
    path = save(outcome, tmp_path / "run.json")
    again, exact = replay(path)
    assert exact
    assert again.digest == outcome.digest
    settings, plan, choices, _ = load(path)
    assert (settings, plan, choices) == (outcome.settings, outcome.plan, outcome.choices)


@pytest.fixture(scope="module")
def budget() -> object:
    """The bounded budget of ``make test``: 240 schedules, all providers (SQLite lane)."""
    return run_seeds(range(240), provider="mix")


def test_budget_every_schedule_ends_quiescent(budget: object) -> None:
    """Every schedule of the budget heals and ends final with nothing in flight."""
    summary = budget
    assert getattr(summary, "schedules") == 240  # noqa: B009
    assert getattr(summary, "by_invariant")["final"] == 0  # noqa: B009


def test_budget_finds_no_violation(budget: object) -> None:
    """The promise holds on every schedule of the budget."""
    assert dict(getattr(budget, "by_invariant")) == {}  # noqa: B009


def test_mutation_unfenced_intent_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the intent's claim-token fence removed, a fenced_intent (or intent_first)
    violation shows up."""
    monkeypatch.setitem(kirim.store.sqlite.Q, "insert_intents", UNFENCED)
    found = None
    for seed in range(200):
        outcome = run_schedule(settings_for(seed, "mix"))
        if any(v.name in ("fenced_intent", "intent_first") for v in outcome.violations):
            found = seed
            break
    assert found is not None


def test_mutation_unfenced_intent_is_caught_on_postgresql(
    pg_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's intent statement with its claim fence taken out: fenced_intent fires
    on the PostgreSQL lane too, whose intent audit (``pglane.INTENT_AUDIT_SQL``) was
    missing (the lane judged no intent's claim: the SQLite seeds that catch the mutation,
    30 among them, passed there)."""
    from kirim.store.postgres.driver import Q as PG

    fence = "d.claim_token = u.token AND d.status = 'processing'"
    assert fence in PG["insert_intents"]
    monkeypatch.setitem(PG, "insert_intents", PG["insert_intents"].replace(fence, "true"))
    for seed in (30, 93, 158):  # where the SQLite lane catches its own mutation
        outcome = run_schedule(settings_for(seed, "mix", database=pg_server))
        if any(v.name == "fenced_intent" for v in outcome.violations):
            return
    pytest.fail("an intent written without its claim was not caught on PostgreSQL")


def test_unmutated_code_never_violates_intent_first() -> None:
    """Today's fencing holds: the same seeds show no intent_first violation."""
    summary = run_seeds(range(40), provider="mix")
    assert summary.by_invariant["intent_first"] == 0
    assert summary.by_invariant["fenced_intent"] == 0


def test_mutation_in_doubt_check_disabled_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the in-doubt check skipped, a plain assume_sent channel sends twice."""
    monkeypatch.setattr(Deliverer, "_in_doubt", never_in_doubt)
    found = None
    for seed in range(200):
        outcome = run_schedule(Settings.draw(seed, provider="plain", on_unknown="assume_sent"))
        if any(v.name == "at_most_once" for v in outcome.violations):
            found = seed
            break
    assert found is not None


def test_plain_assume_sent_has_no_duplicates_today() -> None:
    """Unmutated, the same plain assume_sent schedules never deliver twice."""
    summary = run_seeds(range(40), provider="plain", on_unknown="assume_sent")
    assert summary.by_invariant["at_most_once"] == 0


def test_shrinking_keeps_the_violation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shrunk failure (of a mutated worker) still violates the same invariant and is no
    bigger."""
    monkeypatch.setattr(Deliverer, "_in_doubt", never_in_doubt)
    outcome = next(
        found
        for seed in range(200)
        if (found := run_schedule(Settings.draw(seed, provider="plain"))).violations
    )
    small = shrink(outcome, budget=40)
    assert any(v.name == outcome.violations[0].name for v in small.violations)
    assert len(small.plan) <= len(outcome.plan)
    assert len(small.choices) <= len(outcome.choices)


@pytest.mark.parametrize("path", SEEDS, ids=[p.stem for p in SEEDS])
def test_saved_seed_is_a_replayable_failure_file(path: Path) -> None:
    """Each saved regression seed loads, with its configuration, plan and timeline."""
    settings, _, _, data = load(path)
    assert settings.seed >= 0
    assert data["timeline"]
    assert data["violations"]


@pytest.mark.parametrize("path", SEEDS, ids=[p.stem for p in SEEDS])
def test_saved_seed_holds(path: Path) -> None:
    """The saved schedule, replayed, violates no invariant."""
    outcome, _ = replay(path)
    assert outcome.violations == []


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--workload", "flows", "--policy", "pct:3"], "--policy"),
        (["--workload", "flows", "--workers", "2", "--out", "x"], "--workers, --out"),
        (["--replay", str(SEEDS[0]), "--seeds", "5"], "--seeds"),
    ],
)
def test_command_refuses_options_the_run_would_ignore(args: list[str], named: str) -> None:
    """An option given where it has no effect is a usage error naming it (the flows lane
    draws its own order, a replay its saved settings), not silently dropped."""
    result = CliRunner().invoke(explore, args)
    assert result.exit_code == 2, result.output
    assert f"{named}: not used here" in result.output


def test_command_runs_seeds_and_prints_json(tmp_path: Path) -> None:
    """``kirim explore --json`` reports the schedules run and the failing seeds."""
    result = CliRunner().invoke(
        explore, ["--seeds", "6", "--json", "--shrink-budget", "0", "--out", str(tmp_path)]
    )
    assert result.exit_code in (0, 1), result.output
    data = json.loads(result.output)
    assert data["schedules"] == 6
    assert result.exit_code == (1 if data["failing_schedules"] else 0)


def test_command_replays_a_file() -> None:
    """``kirim explore --replay FILE`` prints the timeline and whether it was exact."""
    result = CliRunner().invoke(explore, ["--replay", str(SEEDS[0])])
    assert "replayed exactly:" in result.output
    assert result.exit_code in (0, 1)


def test_command_plays_a_saved_flows_world() -> None:
    """``kirim explore --replay`` of a saved flows world (tests/explore/seeds/flows/)
    plays and checks it, and says whether it still reaches what it was kept for."""
    saved = sorted((Path(__file__).parent / "seeds" / "flows").glob("*.json"))[0]
    result = CliRunner().invoke(explore, ["--replay", str(saved), "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["violations"] == []
    assert shown["missed"] == []
    assert set(json.loads(saved.read_text())["reaches"]) <= set(shown["reached"])


@pytest.mark.parametrize("text", ["not json", '{"x": 1}', "[1, 2]"])
def test_command_refuses_a_file_it_cannot_replay(tmp_path: Path, text: str) -> None:
    """A file that is neither a failure file nor a flows world: a usage error (exit 2),
    one line, no traceback."""
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    result = CliRunner().invoke(explore, ["--replay", str(bad)])
    assert result.exit_code == 2, result.output
    assert "--replay" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_every_option_has_help() -> None:
    """Each option of ``kirim explore`` says what it does."""
    assert [p.name for p in explore.params if not getattr(p, "help", "")] == []
