"""Chaos with real worker processes: kirim against the write-up's naive flow, both backends.

Each test runs a few hundred notifications through three worker processes with a
one-second lease, a long-tailed receiver, timeouts and 503s, while the harness
SIGKILLs and SIGSTOPs workers that have requests in flight. The same seed and the
same faults run against the naive flow to prove that the harness sees duplicates
when there are some. With ``--clock-skew`` past the lease every worker runs on its
own clock (kirim keeps the database's, the naive flow trusts its own), and with
``--lookup`` kirim asks a receiver that honours no key before resending.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kirim.simulate.harness import simulate
from kirim.simulate.options import SimOptions, Strategy, parse_latency
from kirim.simulate.result import SimResult

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

CHAOS = SimOptions(
    notifications=300,
    workers=3,
    concurrency=8,
    lease=1.0,
    latency=parse_latency("lognormal:0.05:1.5"),  # p99 past the lease
    provider_timeout=1.5,
    timeout_rate=0.02,
    error_rate=0.02,
    kill_rate=0.01,  # 3 SIGKILLs
    stall_rate=0.01,  # 3 SIGSTOPs of 1.5-2.5 leases
    seed=20260721,
    deadline=45,
)


def run(
    database_url: str,
    *,
    strategy: Strategy = "kirim",
    idempotent: bool,
    logs: Path | None = None,
    **changes: Any,
) -> SimResult:
    opts = replace(CHAOS, strategy=strategy, idempotent=idempotent, **changes)
    result = simulate(opts, empty_database=database_url, logs=logs)
    assert not result.timed_out, result
    assert result.worker_crashes == [], result
    assert result.faults["kills"] == 3, result
    assert result.faults["stalls"] == 3, result
    return result


def test_kills_and_stalls_with_an_idempotent_receiver(database_url: str) -> None:
    """Killed and frozen workers mid-send: no duplicate reaches the user, nothing is lost."""
    r = run(database_url, idempotent=True)
    assert (r.duplicates, r.lost, r.unfinished) == (0, 0, 0), r
    assert r.delivered == r.notifications, r
    assert r.duplicate_requests > 0, "the faults should have forced same-key resends"


def test_kills_and_stalls_with_a_plain_receiver_and_assume_sent(database_url: str) -> None:
    """A receiver that honours nothing: at most once, and every doubt reported."""
    r = run(database_url, idempotent=False)
    assert (r.duplicates, r.duplicate_requests, r.lost, r.unfinished) == (0, 0, 0, 0), r
    assert r.unreported_in_doubt == 0, r
    assert r.in_doubt > 0, "the faults should have left deliveries in doubt"
    assert r.delivered + r.in_doubt + r.failed >= r.notifications, r


def test_the_naive_flow_sends_duplicates_under_the_same_faults(database_url: str) -> None:
    """The write-up's flow, same seed and faults: the harness sees it send twice."""
    r = run(database_url, strategy="naive", idempotent=False)
    assert r.duplicates > 0, r
    assert r.duplicate_requests >= r.duplicates, r
    assert r.promise_kept is None


def test_the_naive_flow_with_an_idempotent_receiver(database_url: str) -> None:
    """The provider-side fix alone: requests are repeated, the user gets each once."""
    r = run(database_url, strategy="naive", idempotent=True)
    assert r.duplicate_requests > 0, r
    assert r.duplicates == 0, r


def test_cli_prints_one_json_object(database_url: str) -> None:
    """kirim simulate --json prints one object with the documented keys and exits 0."""
    args = ["--notifications", "60", "--workers", "2", "--lease", "1", "--latency", "fixed:0.01"]
    args += ["--kill-rate", "0.02", "--stall-rate", "0", "--seed", "3", "--deadline", "40"]
    if database_url.startswith("postgresql:"):
        args += ["--database", database_url]  # a throw-away database on that server
    done = subprocess.run(
        [sys.executable, "-m", "kirim", "simulate", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=55,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["notifications"] == 60
    assert (data["duplicates"], data["lost"]) == (0, 0)
    assert data["faults"]["kills"] == 1
    assert data["backend"] == ("sqlite" if database_url.startswith("sqlite:") else "postgres")


SKEW = 3.0  # three leases: a worker that trusted its clock would revoke live leases


def assert_skewed(r: SimResult) -> None:
    """Every worker process ran on its own clock, and they disagree by more than a lease."""
    offsets = r.clock_offsets
    assert len(offsets) == r.workers_started, r
    assert all(-SKEW <= x <= SKEW for x in offsets.values()), offsets
    assert max(offsets.values()) - min(offsets.values()) > CHAOS.lease, offsets
    assert r.clock_skew == SKEW


def test_kirim_with_clocks_skewed_past_the_lease(database_url: str) -> None:
    """Each worker's clock off by up to ±3 leases: leases, takeover and reaping run on
    the database's clock, so no live lease is revoked: 0 duplicates, 0 lost."""
    r = run(database_url, idempotent=False, clock_skew=SKEW)
    assert_skewed(r)
    assert (r.duplicates, r.duplicate_requests, r.lost, r.unfinished) == (0, 0, 0, 0), r
    assert r.unreported_in_doubt == 0, r
    assert r.promise_kept is True, r


def test_the_naive_flow_under_skew_sends_more_duplicates(database_url: str) -> None:
    """The same skew on the write-up's flow, which decides leases by the worker's clock:
    a worker ahead takes live jobs, so more notifications arrive twice than without."""
    plain = run(database_url, strategy="naive", idempotent=False)
    skewed = run(database_url, strategy="naive", idempotent=False, clock_skew=SKEW)
    assert_skewed(skewed)
    assert skewed.duplicates > plain.duplicates > 0, (plain, skewed)


def test_kirim_with_lookup_on_a_receiver_that_honours_nothing(
    database_url: str, tmp_path: Path
) -> None:
    """lookup = true against a receiver that deduplicates nothing, with timeouts, 503s,
    kills and stalls: a found key is recorded sent, a "not found" waits until every
    earlier request has settled before sending again, so each notification reaches
    the user exactly once and none is left in doubt."""
    logs = tmp_path / "logs"
    r = run(database_url, idempotent=False, lookup=True, timeout_rate=0.04, logs=logs)
    assert (r.duplicates, r.duplicate_requests, r.lost, r.unfinished) == (0, 0, 0, 0), r
    assert r.unreported_in_doubt == 0, r
    assert r.delivered == r.notifications, r
    assert r.promise_kept is True, r
    assert r.lookup is True
    assert r.lookups.get("found", 0) > 0, r
    assert r.lookups.get("not_found", 0) > 0, r
    assert r.resolved > 0, r
    said = "".join(p.read_text() for p in logs.glob("worker-*.log"))
    # Whether a "not found" came before its request settled (and waited) depends on
    # the timing of the run; tests/contract/test_edges.py forces that path.
    assert "decision=lookup_not_found_send" in said


def test_kirim_with_lookup_and_skew_together(database_url: str) -> None:
    """Lookup on skewed workers: "settled" is the database's time too."""
    r = run(database_url, idempotent=False, lookup=True, clock_skew=SKEW)
    assert_skewed(r)
    assert (r.duplicates, r.duplicate_requests, r.lost, r.unfinished) == (0, 0, 0, 0), r
    assert r.delivered == r.notifications, r
    assert r.promise_kept is True, r


def test_cli_reports_offsets_and_lookups(database_url: str) -> None:
    """kirim simulate --clock-skew --lookup --json prints the offsets and lookups."""
    args = ["--notifications", "60", "--workers", "2", "--lease", "1", "--latency", "fixed:0.01"]
    args += ["--kill-rate", "0.02", "--stall-rate", "0", "--seed", "3", "--deadline", "40"]
    args += ["--clock-skew", "2.5", "--lookup"]
    if database_url.startswith("postgresql:"):
        args += ["--database", database_url]
    done = subprocess.run(
        [sys.executable, "-m", "kirim", "simulate", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=55,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["duplicates"], data["lost"]) == (0, 0)
    assert data["clock_skew"] == 2.5
    assert len(data["clock_offsets"]) == data["workers_started"] >= 3  # one was killed
    assert all(-2.5 <= x <= 2.5 for x in data["clock_offsets"].values())
    assert data["lookup"] is True
    assert set(data["lookups"]) <= {"found", "not_found"}
