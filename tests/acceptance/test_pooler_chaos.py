"""The chaos run through PgBouncer in transaction pooling mode: worker processes
SIGKILLed and frozen mid-send while every transaction of theirs goes through a pooler
whose server connections they share (two per database): 0 lost, 0 duplicates, every
doubt reported.

``make test`` runs one seeded run; ``make chaos`` sets ``KIRIM_CHAOS_RUNS=10`` for
ten (the figure of docs/operations.md).
"""

from __future__ import annotations

import os
from dataclasses import replace
from urllib.parse import urlsplit

import pytest

from kirim.simulate.harness import simulate
from kirim.simulate.options import SimOptions, parse_latency
from pg import ADMIN_URL, fresh_database
from pgbouncer import bouncer, pooled_url

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

RUNS = int(os.environ.get("KIRIM_CHAOS_RUNS", "0")) or 1
#: the run of the report that found the loss (400 notifications, 2 workers, lease 2 s,
#: a SIGKILL per 100 notifications), with the default receiver's timeouts and 503s
THROUGH_POOLER = SimOptions(
    notifications=400,
    workers=2,
    concurrency=10,
    lease=2.0,
    latency=parse_latency("lognormal:0.1:1.5"),
    timeout_rate=0.01,
    error_rate=0.01,
    kill_rate=0.01,
    stall_rate=0.004,
    deadline=150,
)


@pytest.mark.parametrize("run", range(RUNS))
def test_chaos_through_a_transaction_pooler_loses_nothing(
    request: pytest.FixtureRequest, run: int
) -> None:
    """Kills and stalls through PgBouncer (transaction mode, two server connections):
    every notification is delivered or reported, none twice, no worker crashes."""
    pooler = bouncer(request, urlsplit(ADMIN_URL).port or 5432, pool_size=2)
    url = pooled_url(fresh_database(request), pooler)
    r = simulate(replace(THROUGH_POOLER, seed=2800 + run), empty_database=url)
    assert not r.timed_out, r
    assert r.worker_crashes == [], r
    assert (r.lost, r.unfinished, r.unreported_in_doubt, r.duplicates) == (0, 0, 0, 0), r
    assert r.faults["kills"] == 4, r
