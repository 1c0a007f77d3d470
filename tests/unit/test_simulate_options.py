"""The knobs of ``kirim simulate``: latency specs, rates, ratios and their errors."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kirim.cli import main
from kirim.config import load_config
from kirim.devtools.receiver import Receiver
from kirim.engine import Kirim
from kirim.observe.logging import configure
from kirim.simulate import naive, report
from kirim.simulate.harness import _KirimSide, _NaiveSide, fault_plan
from kirim.simulate.options import (
    Latency,
    SimOptions,
    parse_latency,
    parse_rate,
    parse_ratios,
)
from kirim.simulate.result import SimResult
from kirim.simulate.skew import OffsetClock, Offsets


def test_fixed_latency() -> None:
    """fixed:S always answers after S seconds."""
    spec = parse_latency("fixed:0.25")
    assert spec == Latency("fixed", 0.25)
    assert spec.sample(random.Random(1)) == 0.25


def test_uniform_latency_stays_within_bounds() -> None:
    """uniform:A:B draws between A and B."""
    spec = parse_latency("uniform:0.1:0.3")
    rng = random.Random(2)
    draws = [spec.sample(rng) for _ in range(1000)]
    assert min(draws) >= 0.1
    assert max(draws) <= 0.3


def test_lognormal_latency_has_the_median_and_p99_asked_for() -> None:
    """lognormal:MEDIAN:P99 draws with that median and 99th percentile."""
    spec = parse_latency("lognormal:0.2:3")
    rng = random.Random(3)
    draws = sorted(spec.sample(rng) for _ in range(40_000))
    assert statistics.median(draws) == pytest.approx(0.2, rel=0.05)
    assert draws[int(0.99 * len(draws))] == pytest.approx(3.0, rel=0.15)


def test_lognormal_with_equal_median_and_p99_is_fixed() -> None:
    """A log-normal without spread always gives its median."""
    assert parse_latency("lognormal:0.5:0.5").sample(random.Random(4)) == pytest.approx(0.5)


def test_latency_spec_prints_as_it_was_written() -> None:
    """str() of a spec gives text that parses back to the same spec."""
    for text in ("fixed:1", "uniform:0.1:0.5", "lognormal:0.2:3"):
        assert str(parse_latency(text)) == text
        assert parse_latency(str(parse_latency(text))) == parse_latency(text)


def test_latency_kind_is_case_insensitive_and_trimmed() -> None:
    """LogNormal:… with spaces around is accepted."""
    assert parse_latency(" LogNormal:0.2:3 ") == Latency("lognormal", 0.2, 3.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gaussian:1:2", "unknown distribution 'gaussian'"),
        ("fixed", "fixed takes 1 number"),
        ("fixed:1:2", "fixed takes 1 number"),
        ("uniform:1", "uniform takes 2 number"),
        ("uniform:0.5:0.1", "needs A <= B"),
        ("lognormal:0:3", "median must be greater than 0"),
        ("lognormal:3:0.2", "P99 must be at least the median"),
        ("fixed:fast", "'fast' is not a number"),
        ("fixed:-1", "must be a finite number of seconds >= 0"),
        ("fixed:inf", "must be a finite number of seconds >= 0"),
        ("", "unknown distribution"),
    ],
)
def test_bad_latency_specs_say_what_is_wrong(text: str, message: str) -> None:
    """Every malformed spec raises ValueError naming the problem."""
    with pytest.raises(ValueError, match=message):
        parse_latency(text)


def test_latency_median_of_each_kind() -> None:
    """The median, against which the --plot sweep takes its lease/latency ratios."""
    assert parse_latency("uniform:0:1").median == 0.5
    assert parse_latency("lognormal:0.2:3").median == 0.2
    assert parse_latency("fixed:2").median == 2


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0.0), ("0.01", 0.01), ("1", 1.0), ("1%", 0.01), (" 2.5% ", 0.025), ("100%", 1.0)],
)
def test_rates_as_fractions_or_percentages(text: str, value: float) -> None:
    """A rate is a probability, written 0.01 or 1%."""
    assert parse_rate(text) == pytest.approx(value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("often", "is not a number"),
        ("1.5", "between 0 and 1"),
        ("-0.1", "between 0 and 1"),
        ("150%", "between 0 and 1"),
        ("nan", "between 0 and 1"),
        ("%", "is not a number"),
    ],
)
def test_bad_rates_say_what_is_wrong(text: str, message: str) -> None:
    """Rates outside [0, 1] or not numbers raise ValueError naming the option."""
    with pytest.raises(ValueError, match=message) as info:
        parse_rate(text, name="--kill-rate")
    assert "--kill-rate" in str(info.value)


def test_ratios_are_sorted_and_unique() -> None:
    """--ratios 5,1,2,1 sweeps 1, 2, 5."""
    assert parse_ratios("5,1, 2,1") == (1.0, 2.0, 5.0)


@pytest.mark.parametrize("text", ["", "1,,2", "1,x", "0", "-1,2"])
def test_bad_ratios_are_refused(text: str) -> None:
    """Empty items, words and non-positive ratios raise ValueError."""
    with pytest.raises(ValueError, match=r"ratio|not a number"):
        parse_ratios(text)


def test_options_validate_their_ranges() -> None:
    """SimOptions.validate() refuses counts below 1 and rates that do not add up."""
    assert SimOptions().validate() == SimOptions()
    with pytest.raises(ValueError, match="workers must be at least 1"):
        SimOptions(workers=0).validate()
    with pytest.raises(ValueError, match="lease must be a positive"):
        SimOptions(lease=0).validate()
    with pytest.raises(ValueError, match="must not exceed 1"):
        SimOptions(timeout_rate=0.6, error_rate=0.6).validate()


def test_rates_become_counts_of_faults() -> None:
    """Per-delivery kill and stall rates become a number of faults for the run."""
    opts = SimOptions(notifications=2000, kill_rate=0.01, stall_rate=0.004)
    assert (opts.kills, opts.stalls) == (20, 8)
    assert opts.hang_s > opts.provider_timeout


def test_fault_plan_spreads_faults_over_the_run() -> None:
    """Faults wait for evenly spaced progress and the same seed gives the same plan."""
    opts = SimOptions(notifications=100, kill_rate=0.02, stall_rate=0.02)
    plan = fault_plan(opts, random.Random(5))
    assert [at for at, _ in plan] == [20, 40, 60, 80]
    assert sorted(kind for _, kind in plan) == ["kill", "kill", "stall", "stall"]
    assert plan == fault_plan(opts, random.Random(5))


def _result(**changes: object) -> SimResult:
    base: dict[str, object] = {
        "strategy": "kirim",
        "backend": "sqlite",
        "seed": 1,
        "idempotent": False,
        "on_unknown": "assume_sent",
        "lease": 2.0,
        "latency": "fixed:0.1",
        "notifications": 10,
        "delivered": 10,
        "duplicate_requests": 0,
        "duplicates": 0,
        "lost": 0,
        "in_doubt": 0,
        "unreported_in_doubt": 0,
        "failed": 0,
        "unfinished": 0,
        "retries": 0,
        "dead_lettered": 0,
        "seconds": 1.0,
        "throughput_per_s": 10.0,
        "latency_p50_s": 0.1,
        "latency_p99_s": 0.2,
        "faults": {"kills": 0, "stalls": 0, "timeouts": 0, "errors": 0},
        "workers_started": 1,
    }
    base.update(changes)
    return SimResult(**base)  # type: ignore[arg-type]


def test_promise_is_judged_for_kirim_only() -> None:
    """Duplicates break kirim's promise unless at-least-once was chosen; naive promises none."""
    assert _result().promise_kept is True
    assert _result(duplicates=1).promise_kept is False
    assert _result(lost=1).promise_kept is False
    assert _result(unreported_in_doubt=1).promise_kept is False
    assert _result(duplicates=1, on_unknown="retry").promise_kept is True
    assert _result(strategy="naive", duplicates=5).promise_kept is None


def test_json_has_the_documented_keys() -> None:
    """The JSON object carries every key the README and --help name."""
    data = _result().as_json()
    for key in (
        "notifications",
        "delivered",
        "duplicate_requests",
        "duplicates",
        "lost",
        "in_doubt",
        "retries",
        "dead_lettered",
        "throughput_per_s",
        "latency_p50_s",
        "latency_p99_s",
        "faults",
    ):
        assert key in data
    assert set(data["faults"]) == {"kills", "stalls", "timeouts", "errors"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--latency", "gaussian:1"], "unknown distribution"),
        (["--kill-rate", "2"], "between 0 and 1"),
        (["--ratios", "0"], "greater than 0"),
        (["--workers", "0"], "0 is not in the range"),
        (["--database", "sqlite:///x.db"], "simulate takes a postgresql:// URL"),
    ],
)
def test_cli_refuses_bad_knobs_with_exit_2(args: list[str], message: str) -> None:
    """Bad knobs exit 2 with a message naming the problem, before anything runs."""
    result = CliRunner().invoke(main, ["simulate", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_cli_help_documents_every_knob() -> None:
    """kirim simulate --help names each knob and the PostgreSQL policy."""
    result = CliRunner().invoke(main, ["simulate", "--help"])
    assert result.exit_code == 0
    for flag in (
        "--notifications",
        "--workers",
        "--concurrency",
        "--lease",
        "--latency",
        "--timeout-rate",
        "--error-rate",
        "--kill-rate",
        "--stall-rate",
        "--idempotent / --no-idempotent",
        "--seed",
        "--strategy",
        "--json",
        "--plot",
        "kirim_sim_<hex>",
    ):
        assert flag in result.output


def test_plot_without_matplotlib_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """--plot without the plot extra says how to install it, before running anything."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = CliRunner().invoke(main, ["simulate", "--plot", "out.png"])
    assert result.exit_code == 2
    assert "pip install 'kirim[plot]'" in result.output


def test_plot_draws_both_strategies(tmp_path: Path) -> None:
    """The sweep's plot is a PNG file with a line per strategy."""
    pytest.importorskip("matplotlib")
    runs = [
        (ratio, _result(strategy=strategy, duplicates=dups, lease=ratio))
        for ratio, strategy, dups in [(1, "naive", 7), (1, "kirim", 0), (10, "naive", 1)]
    ]
    path = tmp_path / "sweep.png"
    report.plot(runs, path, subtitle="test")
    assert path.read_bytes().startswith(b"\x89PNG")
    assert report.per_thousand(runs[0][1]) == 700


# -- --clock-skew and --lookup ---------------------------------------------------------


async def test_offset_clock_shifts_the_time_not_the_durations() -> None:
    """now() is the system clock shifted; monotonic() and sleep() are real."""
    ahead = OffsetClock(90.0)
    assert ahead.now() - time.time() == pytest.approx(90.0, abs=0.5)
    assert OffsetClock(-4.5).now() - time.time() == pytest.approx(-4.5, abs=0.5)
    assert ahead.monotonic() == pytest.approx(time.monotonic(), abs=0.5)
    t0 = time.monotonic()
    await ahead.sleep(0.05)
    assert 0.04 <= time.monotonic() - t0 < 1
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite"):
            OffsetClock(bad)


def test_offsets_are_seeded_and_within_the_skew() -> None:
    """Each worker's offset is uniform in ±skew, the same for the same seed, 0 without."""

    def five(seed: int) -> list[float]:
        run = Offsets(2.0, seed=seed)
        return [run.draw() for _ in range(5)]

    assert five(7) == five(7)
    assert five(7) != five(8)
    run = Offsets(2.0, seed=7)
    many = [run.draw() for _ in range(500)]
    assert all(-2.0 <= x <= 2.0 for x in many)
    assert min(many) < -1.5
    assert max(many) > 1.5
    assert Offsets(0.0, seed=7).draw() == 0.0
    with pytest.raises(ValueError, match="clock skew"):
        Offsets(-1.0, seed=1)


def test_options_validate_skew_and_lookup() -> None:
    """clock_skew is seconds >= 0; lookup runs against a receiver that honours no key."""
    assert SimOptions(clock_skew=3.0, lookup=True).validate().clock_skew == 3.0
    with pytest.raises(ValueError, match="clock_skew"):
        SimOptions(clock_skew=-1).validate()
    with pytest.raises(ValueError, match="clock_skew"):
        SimOptions(clock_skew=float("inf")).validate()
    with pytest.raises(ValueError, match="drop --idempotent"):
        SimOptions(lookup=True, idempotent=True).validate()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--clock-skew", "-1"], "-1"),
        (["--clock-skew", "soon"], "is not a valid float"),
        (["--lookup", "--idempotent"], "drop --idempotent"),
    ],
)
def test_cli_refuses_bad_skew_and_lookup(args: list[str], message: str) -> None:
    """Bad --clock-skew values and --lookup with --idempotent exit 2 before anything runs."""
    result = CliRunner().invoke(main, ["simulate", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_cli_help_documents_skew_and_lookup() -> None:
    """--help names both options, the offsets in the output and that naive has no lookup."""
    result = CliRunner().invoke(main, ["simulate", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for phrase in (
        "--clock-skew",
        "--lookup",
        "clock_offsets",
        "The naive strategy ignores --lookup",
        "seeded by --seed",
    ):
        assert phrase in text


def test_kirim_side_config_and_argv_carry_lookup_and_offset(tmp_path: Path) -> None:
    """--lookup gives kirim's channel lookup = true and the receiver's lookup URL; each
    worker gets --clock-offset (none when its offset is 0). The naive flow gets the
    offset and no lookup."""
    opts = SimOptions(lookup=True, lease=1.0)
    lookup_url = "http://127.0.0.1:1/lookup/{key}"
    side = _KirimSide(
        opts, "sqlite:///x.db", "http://127.0.0.1:1/notify", lookup_url, tmp_path, False
    )
    channel = load_config(side.config("worker-1")).channels["push"]
    assert channel.lookup is True
    assert channel.build().provider.lookup_url == lookup_url
    argv = side.argv("worker-1", -1.25)
    assert argv[-1] == "--clock-offset=-1.25"
    assert "--clock-offset" not in " ".join(side.argv("worker-2", 0.0))
    plain = _KirimSide(
        SimOptions(), "sqlite:///x.db", "http://127.0.0.1:1/notify", lookup_url, tmp_path, False
    )
    assert load_config(plain.config("worker-1")).channels["push"].lookup is False
    naive_side = _NaiveSide(opts, "sqlite:///x.db", "http://h/notify", lookup_url, tmp_path, False)
    naive_argv = naive_side.argv("worker-1", 2.5)
    assert "--clock-offset=2.5" in naive_argv
    assert not any("lookup" in a for a in naive_argv)


def test_report_shows_offsets_and_lookups() -> None:
    """The table lists each worker's offset and the lookups; the JSON carries them."""
    r = _result(
        clock_skew=3.0,
        clock_offsets={"worker-10": 0.5, "worker-2": -2.25},
        lookup=True,
        lookups={"found": 4, "not_found": 1},
        resolved=4,
    )
    console = report.Console(record=True, width=200)
    report.show(console, r)
    text = console.export_text()
    assert "skew ±3s" in text
    assert "worker-2 -2.250s, worker-10 +0.500s" in text
    assert "found / not found" in text
    assert "4 / 1" in text
    data = r.as_json()
    assert data["clock_offsets"] == {"worker-10": 0.5, "worker-2": -2.25}
    assert (data["clock_skew"], data["lookup"], data["resolved"]) == (3.0, True, 4)
    assert data["lookups"] == {"found": 4, "not_found": 1}
    plain = report.Console(record=True, width=200)
    report.show(plain, _result())
    assert "skew" not in plain.export_text()
    assert "lookups" not in plain.export_text()


# -- the naive flow trusts its own clock -----------------------------------------------


def test_a_naive_worker_whose_clock_is_ahead_steals_a_live_lease(tmp_path: Path) -> None:
    """The write-up's lease is decided by the claiming worker's clock: one that runs
    more than a lease ahead takes a job whose lease is live, so both send."""
    db = naive.NaiveDb(f"sqlite:///{tmp_path / 'naive.db'}").connect()
    try:
        db.create_tables()
        naive.enqueue(db, [("e-1", "r-1", "push", {})], attempts=3)
        now = time.time()
        assert [row[0] for row in db.claim("A", 10.0, 5, now=now)] == [1]
        assert db.claim("B", 10.0, 5, now=now + 5) == []  # lease live by B's clock
        stolen = db.claim("C", 10.0, 5, now=now + 11)  # C's clock is 11 s ahead
        assert [row[0] for row in stolen] == [1]
    finally:
        db.close()


def test_the_naive_worker_runs_on_its_offset_clock(tmp_path: Path) -> None:
    """--clock-offset S puts the naive worker on a clock S seconds off; not finite: exit 2."""
    settings = naive.NaiveSettings(url="http://h/notify", worker_id="w", clock_offset=30.0)
    worker = naive.NaiveWorker(naive.NaiveDb("sqlite:///unused.db"), settings)
    assert worker.clock.now() - time.time() == pytest.approx(30.0, abs=0.5)
    with pytest.raises(SystemExit) as exited:
        naive.main(["--database", "sqlite:///x", "--url", "http://h", "--worker-id", "w",
                    "--clock-offset", "inf"])  # fmt: skip
    assert exited.value.code == 2


# -- kirim worker --clock-offset -------------------------------------------------------


@pytest.fixture
def _restore_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("KIRIM_DATABASE_URL", raising=False)
    yield
    configure(level="warning")


@pytest.mark.usefixtures("_restore_logs")
@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "soon"])
def test_worker_clock_offset_must_be_finite(value: str) -> None:
    """--clock-offset takes a finite number of seconds; anything else exits 2."""
    result = CliRunner().invoke(main, ["worker", "--clock-offset", value])
    assert result.exit_code == 2
    assert "--clock-offset" in result.output


def test_worker_clock_offset_is_hidden() -> None:
    """A knob for simulate and tests: not in kirim worker --help."""
    result = CliRunner().invoke(main, ["worker", "--help"])
    assert result.exit_code == 0
    assert "--clock-offset" not in result.output


@pytest.mark.usefixtures("_restore_logs")
def test_a_worker_with_its_clock_off_still_delivers_by_database_time(tmp_path: Path) -> None:
    """A worker whose clock is 30 s behind sees a job due now as due: leases and due-ness
    are the database's time, not the worker's (by its own clock it would wait 30 s)."""
    database = f"sqlite:///{tmp_path / 'kirim.db'}"
    with Receiver() as receiver:
        config = tmp_path / "kirim.toml"
        config.write_text(f'[channels.push]\nprovider = "webhook"\nurl = "{receiver.url}"\n')

        async def enqueue() -> None:
            app = Kirim(load_config(config, database=database))
            await app.open(migrate=True)
            try:
                await app.notify("e-1", "r-1", "push", {"n": 1})
            finally:
                await app.close()

        asyncio.run(enqueue())
        args = ["--config", str(config), "--database", database, "--log-format", "json"]
        result = CliRunner().invoke(
            main, [*args, "worker", "--burst", "--clock-offset", "-30"], catch_exceptions=False
        )
        assert result.exit_code == 0, result.stderr
        assert receiver.delivered() == 1
    said = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert any(e.get("event") == "clock_offset" and e.get("seconds") == -30 for e in said)
