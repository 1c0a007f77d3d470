"""Failover under load: the primary SIGKILLed at a random moment of a run, the standby
promoted, the run completed by the same worker processes (a multi-host URL with
``target_session_attrs=read-write``).

- Synchronous standby: 0 duplicates at the receiver, 0 lost, every doubt reported,
  and no request the ledger does not know.
- Asynchronous standby (and ``synchronous_commit = off``): what the lost tail costs,
  measured: intents the workers committed and the new primary never had (each one
  noticed: ``ledger_behind``), requests the ledger forgot, duplicates. Printed as one
  ``failover-figures`` line per run (``-s`` shows them; docs/operations.md has them).

``make test`` runs the short version: one synchronous run of 500 notifications (the
asynchronous losses are replayed deterministically there by
tests/acceptance/test_failover_points.py); ``make chaos`` sets ``KIRIM_CHAOS_RUNS=10``:
ten runs of 2,000 notifications in each of the three modes.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from kirim.simulate.harness import simulate
from kirim.simulate.options import SimOptions, parse_latency
from kirim.simulate.result import SimResult
from pgcluster import Cluster, Replication, cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

RUNS = int(os.environ.get("KIRIM_CHAOS_RUNS", "0")) or 1
LONG = "KIRIM_CHAOS_RUNS" in os.environ
UNDER_LOAD = SimOptions(
    notifications=2000 if LONG else 500,
    workers=3,
    concurrency=10,
    lease=2.0,
    latency=parse_latency("lognormal:0.03:0.5"),
    timeout_rate=0.005,
    error_rate=0.005,
    deadline=180,
)
OUTAGE_S = 1.0  # from the primary's death to the promotion (a failover manager's delay)
_REQUEST = re.compile(r"\bevent=provider_request\b.*\bprovider_request_id=(\S+)")
_BEHIND = re.compile(r"\bevent=ledger_behind\b.*\bmissing=(\d+)")


def fail_over_at(made: Cluster, at: int) -> tuple[Callable[[int, int], None], threading.Event]:
    """A progress callback that, once ``at`` notifications have reached the receiver,
    kills the primary and promotes the standby ``OUTAGE_S`` later (in a thread of its
    own: the harness goes on injecting and watching meanwhile)."""
    done = threading.Event()
    started = threading.Event()

    def fail_over() -> None:
        made.kill_primary()
        time.sleep(OUTAGE_S)
        made.promote()
        done.set()

    def progress(delivered: int, _total: int) -> None:
        if delivered >= at and not started.is_set():
            started.set()
            threading.Thread(target=fail_over, daemon=True).start()

    return progress, done


def figures(r: SimResult, logs: Path, url: str) -> dict[str, int]:
    """What the run cost: intents lost (noticed by the workers), requests the ledger
    does not know, duplicates at the receiver."""
    sent: set[str] = set()
    noticed = 0
    for log in logs.glob("worker-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if match := _REQUEST.search(line):
                sent.add(match.group(1))
            elif match := _BEHIND.search(line):
                noticed += int(match.group(1))
    with psycopg.connect(url, autocommit=True) as conn:
        known = {row[0] for row in conn.execute("SELECT provider_request_id FROM kirim_attempts")}
    return {
        "intents_lost_noticed": noticed,
        "requests_forgotten": len(sent - known),
        "requests": len(sent),
        "duplicates": r.duplicates,
        "lost": r.lost,
        "unreported_in_doubt": r.unreported_in_doubt,
    }


def run_failover(
    request: pytest.FixtureRequest, tmp_path: Path, replication: Replication, run: int
) -> tuple[SimResult, dict[str, int]]:
    made = cluster(request, replication)
    url = made.create_database("kirim")
    seed = 2800 + run
    at = random.Random(seed).randrange(
        UNDER_LOAD.notifications // 10, UNDER_LOAD.notifications // 2
    )
    progress, failed_over = fail_over_at(made, at)
    logs = tmp_path / "logs"
    r = simulate(replace(UNDER_LOAD, seed=seed), empty_database=url, logs=logs, progress=progress)
    assert failed_over.is_set(), "the run ended before the failover"
    found = figures(r, logs, url)
    line = {"replication": replication, "seed": seed, "at": at, "seconds": r.seconds, **found}
    print("failover-figures", json.dumps(line))
    assert not r.timed_out, r
    assert r.worker_crashes == [], r
    return r, found


@pytest.mark.parametrize("run", range(RUNS))
def test_sync_failover_under_load_loses_nothing_and_sends_nothing_twice(
    request: pytest.FixtureRequest, tmp_path: Path, run: int
) -> None:
    """Synchronous standby, primary killed mid-run: 0 duplicates, 0 lost, every doubt
    reported, every request known to the ledger, nothing noticed missing."""
    r, found = run_failover(request, tmp_path, "sync", run)
    assert (r.duplicates, r.lost, r.unfinished, r.unreported_in_doubt) == (0, 0, 0, 0), r
    assert found["requests_forgotten"] == 0, found
    assert found["intents_lost_noticed"] == 0, found


@pytest.mark.skipif(not LONG, reason="the long version only (make chaos)")
@pytest.mark.parametrize("replication", ["async", "async-off"])
@pytest.mark.parametrize("run", range(RUNS))
def test_async_failover_under_load_each_forgotten_request_is_noticed(
    request: pytest.FixtureRequest, tmp_path: Path, replication: Replication, run: int
) -> None:
    """Asynchronous standby (with synchronous_commit on, then off), primary killed
    mid-run: whatever the lost tail cost, every request the ledger forgot was an intent
    some worker reported as lost (ledger_behind), and the run still finished."""
    r, found = run_failover(request, tmp_path, replication, run)
    assert found["requests_forgotten"] <= found["intents_lost_noticed"], found
    assert r.unfinished == 0, r
