"""The full workload: the whole configuration drawn per seed, its coverage kept, its
invariants able to fail, and a budget of schedules that holds."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import kirim.store.addresses
import kirim.store.rules
import kirim.store.sqlite.changed
import kirim.store.transitions
from kirim.explore import coverage
from kirim.explore.command import run_seeds
from kirim.explore.scenario import Outcome, Settings, draw_faults, run_schedule
from kirim.explore.shrink import replay, save
from kirim.explore.world import World
from kirim.model import DeliveryStatus, JobStatus
from kirim.worker.decisions import Decisions

#: the suite's budget of full schedules (``make explore`` soaks many more)
BUDGET = range(int(__import__("os").environ.get("KIRIM_FULL_BUDGET", "160")))
#: the seeds the coverage test draws worlds from (drawing is cheap: no schedule runs)
COVERAGE = range(300)


def full(seed: int) -> Settings:
    return Settings.draw(seed, workload="full")


# -- coverage ----------------------------------------------------------------------------


def test_every_setting_is_drawn_or_named_irrelevant() -> None:
    """Each field of Channel, NotificationType and its rules, Preferences,
    WorkerSettings and Config, and each key of a [channels.NAME] table, is drawn by the
    full workload or named irrelevant with the reason: a knob added without explorer
    coverage fails here."""
    assert coverage.unlisted() == []


def test_every_listed_knob_takes_more_than_one_value() -> None:
    """Over the coverage seeds every listed knob takes at least two values: none is
    listed and never drawn."""
    seen = coverage.observe(COVERAGE)
    assert {name: values for name, values in seen.items() if len(values) < 2} == {}


def test_every_fault_kind_is_drawn_by_some_plans_only() -> None:
    """Over the coverage seeds every fault kind (the forced takeover among them) is in
    some full plans and not in others, and the pauses, store faults and takeovers vary
    where they strike."""
    seen = coverage.observe_faults(COVERAGE)
    assert {name: values for name, values in seen.items() if len(values) < 2} == {}


def test_both_lanes_play_one_plan() -> None:
    """A seed's fault plan does not depend on its database: the PostgreSQL lane draws
    every fault the SQLite lane does."""
    for seed in range(40):
        on_sqlite = full(seed)
        on_postgres = replace(on_sqlite, database="postgresql://postgres@127.0.0.1:9/none")
        assert draw_faults(on_postgres) == draw_faults(on_sqlite)


def test_irrelevant_settings_say_why() -> None:
    """Every setting named irrelevant carries a reason, and none is drawn too."""
    assert all(len(why) > 10 for why in coverage.IRRELEVANT.values())
    assert set(coverage.IRRELEVANT) & set(coverage.KNOBS) == set()


# -- determinism -------------------------------------------------------------------------


def test_same_full_seed_same_trace() -> None:
    """A full schedule is deterministic: the same seed gives the same trace twice."""
    runs = [run_schedule(full(seed)) for seed in (7, 7, 8)]
    assert runs[0].digest == runs[1].digest
    assert runs[0].digest != runs[2].digest


def test_a_full_run_replays_exactly_from_its_file(tmp_path: Path) -> None:
    """A full schedule saved to a file replays with the same trace hash."""
    outcome = run_schedule(full(9))
    again, exact = replay(save(outcome, tmp_path / "run.json"))
    assert exact
    assert again.digest == outcome.digest


# -- the budget --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def budget() -> tuple[Any, Counter[str]]:
    """The budget's schedules, with what they exercised."""
    seen: Counter[str] = Counter()

    def step(outcome: Outcome) -> None:
        for line in outcome.lines:
            for what in (
                "failover",
                "rate_wait",
                "callback ",
                "operator_reconcile",
                "operator_retry",
                "operator_prune",
                "digest_sealed",
                "not_configured",
                "in_doubt",
                "prefs ",
                "not_sent",
                "address_retired",
                "replaced on the device",
                "stream_open",
                "feed_read ",
                "takeover delivery=",
            ):
                seen[what] += what in line
        for d in outcome.deliveries:
            seen[f"status:{d['status']}"] += 1
            seen["pruned"] += bool(d.get("explore_pruned"))

    return run_seeds(BUDGET, workload="full", on_step=step), seen


def test_the_full_budget_holds(budget: tuple[Any, Counter[str]]) -> None:
    """Every invariant holds on every schedule of the budget, each ends final (or
    waiting for a send window it is owed)."""
    summary, _ = budget
    assert summary.schedules == len(BUDGET)
    failing = {o.settings.seed: [str(v) for v in o.violations][:2] for o in summary.failing}
    assert failing == {}


def test_the_full_budget_judged_in_the_chaos_words_loses_nothing(
    budget: tuple[Any, Counter[str]],
) -> None:
    """The budget's notifications, judged as simulate and the demo judge theirs: none
    lost, none unfinished, no doubt unreported; some in doubt, failed and denied."""
    summary, _ = budget
    tally = summary.verdicts
    assert tally.notifications > 0
    assert (tally.lost, tally.unfinished, tally.unreported_in_doubt) == (0, 0, 0)
    assert tally.in_doubt > 0
    assert tally.failed > 0
    assert tally.denied > 0
    assert summary.as_dict()["verdicts"]["notifications"] == tally.notifications


def test_the_full_budget_reaches_what_the_invariants_check(
    budget: tuple[Any, Counter[str]],
) -> None:
    """The budget fails over, waits for rates, applies callbacks, reconciles, retries,
    prunes, seals digests, refuses types a worker lacks, settles doubt, flips
    preferences, retires dead device tokens, collapses resends on the device, lands
    stale finishes while another worker holds the claim, and ends deliveries in every
    final status that can be reached."""
    _, seen = budget
    for what in (
        "failover",
        "rate_wait",
        "callback ",
        "operator_reconcile",
        "operator_retry",
        "operator_prune",
        "digest_sealed",
        "not_configured",
        "in_doubt",
        "prefs ",
        "pruned",
        "address_retired",
        "replaced on the device",
        "stream_open",
        "feed_read ",
        "takeover delivery=",
    ):
        assert seen[what] > 0, what
    for status in ("sent", "delivered", "bounced", "failed", "suppressed", "in_doubt"):
        assert seen[f"status:{status}"] > 0, status


# -- the invariants can fail -------------------------------------------------------------


def first_violation(name: str, seeds: range) -> int | None:
    for seed in seeds:
        if any(v.name == name for v in run_schedule(full(seed)).violations):
            return seed
    return None


def test_mutation_claim_time_check_off_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the claim-time preference check removed, preferences_honoured fires."""
    monkeypatch.setattr(kirim.store.rules, "preference_check", lambda *a, **k: None)
    assert first_violation("preferences_honoured", range(90, 130)) is not None


def test_mutation_cleared_columns_left_unwritten_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With SQLite's write-backs leaving out every column a transition clears (a
    value turned NULL taken for no change), claims_at_rest fires: a finished delivery
    still holds its claim token."""

    def careless(set_: Any, record: Any, row: Any) -> tuple[bool, ...]:
        if row is None:
            return (True,) * len(set_.pairs)
        pairs = zip(set_.new(record), set_.old(row), strict=True)
        return tuple(new is not None and new != old for new, old in pairs)

    monkeypatch.setattr(kirim.store.sqlite.changed, "changed", careless)
    assert first_violation("claims_at_rest", range(200)) is not None


def test_mutation_intent_naming_another_job_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every intent naming the first job rather than its claim's (no key from the
    attempts to the jobs on PostgreSQL since schema 18; another delivery's job passes
    SQLite's), jobs_of_attempts fires."""
    original = kirim.store.transitions.record_intents
    monkeypatch.setattr(
        kirim.store.transitions,
        "record_intents",
        lambda intents: original([replace(it, job_id=1) for it in intents]),
    )
    assert first_violation("jobs_of_attempts", range(40)) is not None


def test_mutation_dedup_window_ignored_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the dedup window never judged past (a key trusted for good), key_window
    fires."""
    monkeypatch.setattr(Decisions, "forgotten", lambda self, claim, channel: False)
    assert first_violation("key_window", range(150, 170)) is not None


def test_mutation_reconcile_ending_the_route_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a reconcile that finds nothing ending the delivery ``failed`` whatever its
    attempts (as kirim did before explorer seed 21462), reconcile_goes_on fires: seed 197
    assumes two deliveries sent on a channel whose lookup only the operator has, and
    reconciles them (the operator's retry of the dead letters later hid it from the
    ledger's final state)."""
    real = kirim.store.rules.withdrawn

    def ended(refusal: Any, job: Any) -> Any:
        if refusal is None:  # the reconcile's: nothing found
            return DeliveryStatus.FAILED, JobStatus.DEAD
        return real(refusal, job)

    monkeypatch.setattr(kirim.store.rules, "withdrawn", ended)
    assert first_violation("reconcile_goes_on", range(190, 200)) is not None


def test_mutation_callbacks_not_kept_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """With callbacks for messages not yet recorded dropped again, callback_truth fires."""
    real = kirim.store.transitions.confirm
    monkeypatch.setattr(
        kirim.store.transitions, "confirm", lambda cb, keep=True: real(cb, keep=False)
    )
    assert first_violation("callback_truth", range(40)) is not None


def test_mutation_collapse_trusted_for_good_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a collapse channel's window not given to kirim (a resend trusted to replace
    however late), at_most_once fires: the device showed a resend the user had seen
    go away."""
    from kirim.explore.full import Full

    real = Full._channel

    def forgetful(self: Full, plan: Any) -> Any:
        channel = real(self, plan)
        return replace(channel, dedup_window=None) if plan.collapse else channel

    monkeypatch.setattr(Full, "_channel", forgetful)
    seeds = [
        s
        for s in range(400)
        if any(c.collapse and c.collapse_window for c in World.draw(s).channels)
    ]
    assert first_violation("at_most_once", seeds[:60]) is not None


def test_mutation_fan_out_to_retired_addresses_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the fan-out's read taking retired addresses for living ones, retired_unused
    fires."""
    monkeypatch.setattr(kirim.store.addresses, "addresses_of", _with_retired)
    seeds = [s for s in range(400) if any(a.dead for a in World.draw(s).addresses)]
    assert first_violation("retired_unused", seeds[:60]) is not None


def _with_retired(recipient_ids: Any) -> Any:
    """``addresses_of`` that reads every address, retired ones as if in use."""
    from kirim.store.addresses import address_from
    from kirim.store.sequence import Query

    out: dict[str, list[Any]] = {}
    for rid in sorted(set(recipient_ids)):
        rows = yield Query("list_addresses", {"recipient_id": rid})
        out[rid] = [replace(address_from(r), retired_at=None) for r in rows]
    return out


def test_a_replay_says_whether_it_was_exact_and_whether_the_promise_held(tmp_path: Path) -> None:
    """``kirim explore --replay`` says both things: a file saved by this code replays
    exactly; one saved by other code ran again on this code (not a determinism bug);
    and whether any invariant was violated (issue 22, item 5: it said only 'replayed
    exactly: no')."""
    import json

    from click.testing import CliRunner

    from kirim.explore.command import explore

    path = save(run_schedule(full(9)), tmp_path / "run.json")
    mine = CliRunner().invoke(explore, ["--replay", str(path)])
    assert "replayed exactly: yes" in mine.output
    assert "promise held: yes (no invariant violated)" in mine.output
    data = json.loads(path.read_text())
    data["code"], data["digest"] = "0" * 64, "another"
    path.write_text(json.dumps(data))
    other = CliRunner().invoke(explore, ["--replay", str(path), "--json"])
    shown = json.loads(other.output)
    assert (shown["exact"], shown["same_code"], shown["promise_held"]) == (False, False, True)
    text = CliRunner().invoke(explore, ["--replay", str(path)]).output
    assert "replayed exactly: no: saved by other code" in text


def test_mutation_feed_key_not_unique_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the feed's write no longer keyed by the delivery's idempotency key (each
    commit that marks a delivery sent writes a message under a key of its own),
    feed_exactly_once fires: a delivery whose inbox request succeeded has no message
    of its key."""
    import itertools

    import kirim.store.feed
    from kirim.inbox import FeedMessage

    real = kirim.store.feed.insert_rows
    fresh = itertools.count()

    def unkeyed(messages: Any, now: float) -> Any:
        return real(
            [
                replace(m, idempotency_key=f"{m.idempotency_key}#{next(fresh)}")
                for m in messages
                if isinstance(m, FeedMessage)
            ],
            now,
        )

    monkeypatch.setattr(kirim.store.feed, "insert_rows", unkeyed)
    seeds = [s for s in range(200) if any(c.inbox for c in World.draw(s).channels)]
    assert first_violation("feed_exactly_once", seeds[:40]) is not None


def test_feed_exactly_once_judges_the_feed_audit() -> None:
    """Two writes of one key, a succeeded inbox request with no write, a write with no
    succeeded request, and an inbox delivery in doubt are each a violation; one write
    per succeeded request is none."""
    from kirim.explore.inbox import check_feed
    from kirim.explore.invariants import Ledger

    seed = next(s for s in range(200) if any(c.inbox for c in World.draw(s).channels))
    world = World.draw(seed)
    box = next(c.name for c in world.channels if c.inbox)

    def delivery(i: int, status: str) -> dict[str, Any]:
        return {
            "id": i,
            "idempotency_key": f"k{i}",
            "channel": box,
            "status": status,
            "doubt": None,
        }

    def attempt(i: int, status: str) -> dict[str, Any]:
        return {"id": i, "delivery_id": i, "status": status, "provider": box}

    def write(i: int, n: int) -> dict[str, Any]:
        return {"id": n, "recipient_id": "u1", "idempotency_key": f"k{i}", "created_at": 0.0}

    good = Ledger(
        deliveries=[delivery(1, "sent")],
        attempts=[attempt(1, "succeeded")],
        jobs=[],
        audit=None,
        feed_writes=[write(1, 1)],
    )
    assert check_feed(good, world) == []
    bad = Ledger(
        deliveries=[
            delivery(1, "sent"),
            delivery(2, "sent"),
            delivery(3, "failed"),
            delivery(4, "in_doubt"),
        ],
        attempts=[
            attempt(1, "succeeded"),
            attempt(2, "succeeded"),
            attempt(3, "failed_permanent"),
            attempt(4, "requested"),
        ],
        jobs=[],
        audit=None,
        feed_writes=[write(1, 1), write(1, 2), write(3, 3)],
    )
    found = {(v.delivery, v.name) for v in check_feed(bad, world)}
    assert {(None, "feed_exactly_once"), (1, "feed_exactly_once")} <= found
    assert {(2, "feed_exactly_once"), (3, "feed_exactly_once"), (4, "feed_exactly_once")} <= found


def test_the_inbox_holds_over_its_own_budget() -> None:
    """Over 30 schedules whose worlds have an inbox channel, feed_exactly_once and every
    other invariant hold; the schedules write feed messages, lose commits' answers and
    retry them, and crash workers."""
    seeds = [s for s in range(1000) if any(c.inbox for c in World.draw(s).channels)][:30]
    seen: Counter[str] = Counter()

    def step(outcome: Outcome) -> None:
        for line in outcome.lines:
            for what in ("feed_written", "committed, then the answer was lost", "crash"):
                seen[what] += what in line

    summary = run_seeds(seeds, workload="full", on_step=step)
    failing = {o.settings.seed: [str(v) for v in o.violations][:2] for o in summary.failing}
    assert failing == {}
    assert seen["feed_written"] > 30
    assert seen["committed, then the answer was lost"] > 0


def test_mutation_claim_time_check_off_is_caught_in_the_feed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the claim-time preference check removed, preferences_honoured fires on a
    feed message written when the recipient's preferences or the type's window did not
    allow it (a message deferred by quiet hours in the feed before the window)."""
    monkeypatch.setattr(kirim.store.rules, "preference_check", lambda *a, **k: None)
    seeds = [s for s in range(400) if any(c.inbox for c in World.draw(s).channels)][:40]
    found = None
    for seed in seeds:
        violations = run_schedule(full(seed)).violations
        if any(v.name == "preferences_honoured" and "feed message" in v.detail for v in violations):
            found = seed
            break
    assert found is not None


def test_mutation_an_edge_missing_from_the_table_is_caught(
    monkeypatch: pytest.MonkeyPatch, edges_known: Any
) -> None:
    """With processing -> in_doubt taken out of kirim.machine's table, the explorer's
    known_edges fires (and so does the suite's own check, cleared here): the table and
    the store cannot drift apart."""
    from kirim import machine
    from kirim.model import DeliveryStatus

    missing = (DeliveryStatus.PROCESSING, DeliveryStatus.IN_DOUBT)
    monkeypatch.setattr(machine, "_PAIRS", machine._PAIRS - {missing})
    assert first_violation("known_edges", range(20)) is not None
    assert edges_known.unknown
    edges_known.unknown.clear()


def test_prefs_in_force_tell_two_writes_of_one_instant_apart() -> None:
    """Virtual time can stand still over two preference writes (seed 9384: an opt-out,
    then its deletion, both at t=49.000): the one that returned last is in force; two
    that were under way together leave the check uncertain."""
    from kirim.explore.checks import prefs_at
    from kirim.explore.full import PrefsRecord
    from kirim.preferences import Preferences

    off = Preferences(recipient_id="u1", opt_out=True)
    first = PrefsRecord("u1", off, started=49.0, committed=49.0, begun=1, ended=2)
    then = PrefsRecord("u1", None, started=49.0, committed=49.0, begun=3, ended=4)
    assert prefs_at([first, then], "u1", 49.3) == (True, None)
    assert prefs_at([then, first], "u1", 49.3) == (True, None)
    together = PrefsRecord("u1", None, started=49.0, committed=49.0, begun=1, ended=4)
    first.begun, first.ended = 2, 3
    assert prefs_at([first, together], "u1", 49.3) == (False, None)


def test_mutation_a_stream_that_drops_state_changes_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A live stream that never tells of a mark (read, seen, archived) leaves a browser
    holding a message as it was: ``stream_faithful`` catches it within 200 seeds."""
    import dataclasses

    import kirim.live

    told = kirim.live.FeedHub.read

    async def lying(self: kirim.live.FeedHub, recipient_id: str, after: int) -> Any:
        batch = await told(self, recipient_id, after)
        return dataclasses.replace(batch, changes=[c for c in batch.changes if c.kind != "state"])

    monkeypatch.setattr(kirim.live.FeedHub, "read", lying)
    assert first_violation("stream_faithful", range(200)) is not None


@pytest.mark.parametrize("workers", [2, 3])
def test_every_world_has_a_whole_worker(workers: int) -> None:
    """Whatever the number of workers, one of them knows every type and has every
    channel: the one that expands topic events. With two, both could be drawn partial
    (the first without a channel, the last without the types): no worker expanded the
    topic events, and ``final`` failed 6 of 800 seeds of ``--workers 2`` (58000-58799,
    pct:3) on a world no deployment would be live in."""
    for seed in range(3000):
        plans = World.draw(seed, workers=workers).workers
        assert any(p.types and p.channels is None for p in plans), seed


def test_the_postgresql_lane_waits_for_the_kept_callbacks(pg_server: str) -> None:
    """A provider's "delivered" callback that came before kirim recorded its message id
    is kept, and the reaper applies it on its next round. The PostgreSQL lane ended the
    run as soon as no job was left (only the SQLite lane counted the kept callbacks a
    delivery now matches), and callback_truth failed on a callback the reaper had yet
    to apply (seed 61003, full, random: the message id recorded 0.25 s before the end).
    The saved schedule, replayed on this server, holds."""
    from kirim.explore.shrink import load

    path = (
        Path(__file__).parent / "seeds" / "postgres" / "full-callback-kept-until-the-run-ends.json"
    )
    settings, plan, choices, _ = load(path)
    outcome = run_schedule(replace(settings, database=pg_server), plan=plan, choices=choices)
    assert outcome.violations == []
    assert any("callback" in line and "outcome=unknown" in line for line in outcome.lines)
    assert any(
        "callback_applied" in line or "outcome=applied delivery=7" in line for line in outcome.lines
    )


def test_mutation_inbox_doubt_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the worker's in-doubt policy blind to in-commit channels (an inbox request
    whose commit never came taken for one that may have arrived), the claim that takes
    over an inbox delivery whose recipient opted out meanwhile assumes it sent with
    nothing in the feed (seed 3509: a later answer set the record right, so the final
    ledger alone showed nothing); feed_exactly_once judges each release (the release
    audit) and fires."""
    blind = Decisions.in_doubt

    def in_doubt(self: Decisions, claim: Any, channel: Any, lookup: Any) -> Any:
        saved, self.in_commit = self.in_commit, frozenset()
        try:
            return blind(self, claim, channel, lookup)
        finally:
            self.in_commit = saved

    assert not run_schedule(full(3509)).violations
    monkeypatch.setattr(Decisions, "in_doubt", in_doubt)
    found = [v for v in run_schedule(full(3509)).violations if v.name == "feed_exactly_once"]
    assert found
    assert "where nothing can be in doubt" in found[0].detail
