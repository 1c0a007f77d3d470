"""The knobs of ``kirim simulate``: latency specs, rates, ratios and their errors."""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kirim.cli import main
from kirim.simulate import report
from kirim.simulate.harness import fault_plan
from kirim.simulate.options import (
    Latency,
    SimOptions,
    parse_latency,
    parse_rate,
    parse_ratios,
)
from kirim.simulate.result import SimResult


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
