"""Chaos over SMTP (``kirim simulate --channel smtp``): real worker processes send email
to an aiosmtpd server on 127.0.0.1 that counts what each mailbox receives, while the
harness SIGKILLs and SIGSTOPs workers waiting for the reply to their final "."; the
server answers some RCPT TO with 451 and withholds some replies past the timeout.
kirim's smtp provider keeps every notification to one message; the naive flow, a
plain aiosmtplib send retried on any error with a fresh Message-ID, sends some twice.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from kirim.simulate.harness import simulate
from kirim.simulate.options import SimOptions, Strategy, parse_latency
from kirim.simulate.result import SimResult

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

CHAOS = SimOptions(
    channel="smtp",
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


def run(database_url: str, *, strategy: Strategy = "kirim", **changes: Any) -> SimResult:
    opts = replace(CHAOS, strategy=strategy, **changes)
    result = simulate(opts, empty_database=database_url)
    assert not result.timed_out, result
    assert result.worker_crashes == [], result
    assert result.faults["kills"] == 3, result
    assert result.faults["stalls"] == 3, result
    assert result.channel == "smtp"
    return result


def test_kirim_over_smtp_sends_no_notification_twice(database_url: str) -> None:
    """Kills, stalls, withheld replies and 451s: 0 duplicates, 0 lost, every doubt
    reported (a lost reply after the "." is in doubt, never resent)."""
    r = run(database_url)
    assert (r.duplicates, r.duplicate_requests, r.lost, r.unfinished) == (0, 0, 0, 0), r
    assert r.unreported_in_doubt == 0, r
    assert r.in_doubt > 0, "the faults should have left deliveries in doubt"
    assert r.faults["errors"] > 0, "some RCPT TO should have been answered 451"
    assert r.retries > 0, "a 451 is retried: it was certainly not processed"
    assert r.promise_kept is True, r


def test_the_naive_flow_over_smtp_sends_duplicates(database_url: str) -> None:
    """The same seed and faults on the naive sender: some users get an email twice."""
    r = run(database_url, strategy="naive")
    assert r.duplicates > 0, r
    assert r.promise_kept is None


def test_kirim_over_smtp_with_a_server_that_drops_repeated_message_ids(
    database_url: str,
) -> None:
    """--idempotent: the server drops a Message-ID it has, and kirim's channel says so,
    so a doubtful send is repeated with the same Message-ID: everyone gets one copy."""
    r = run(database_url, idempotent=True)
    assert (r.duplicates, r.lost, r.unfinished) == (0, 0, 0), r
    assert r.delivered == r.notifications, r


def test_cli_runs_the_smtp_channel_and_refuses_lookup() -> None:
    """kirim simulate --channel smtp --json prints one object; --lookup is a usage
    error there (SMTP has no lookup)."""
    args = ["--channel", "smtp", "--notifications", "60", "--workers", "2", "--lease", "1"]
    args += ["--latency", "fixed:0.01", "--kill-rate", "0.02", "--stall-rate", "0"]
    args += ["--seed", "3", "--deadline", "40"]
    done = subprocess.run(
        [sys.executable, "-m", "kirim", "simulate", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=55,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["channel"] == "smtp"
    assert (data["duplicates"], data["lost"]) == (0, 0)
    assert data["faults"]["kills"] == 1
    refused = subprocess.run(
        [sys.executable, "-m", "kirim", "simulate", *args, "--lookup"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert refused.returncode == 2
    assert "SMTP has no lookup" in refused.stderr
