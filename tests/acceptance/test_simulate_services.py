"""Chaos through the services (``kirim simulate --channel apns|fcm|webpush|sms``): real
worker processes send through kirim's provider of the service to its loopback fake,
which counts what the user's device shows, while the harness SIGKILLs and SIGSTOPs
workers with requests in flight and the fake loses or withholds answers after
delivering. kirim's pushes carry the delivery's collapse id, so a resend replaces on
the device; the naive flow's carry a fresh one per send and show again. An SMS has
no collapse: kirim assumes it sent and never resends it.
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

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

CHAOS = SimOptions(
    notifications=150,
    workers=2,
    concurrency=8,
    lease=1.0,
    latency=parse_latency("lognormal:0.05:1.0"),
    provider_timeout=1.5,
    timeout_rate=0.1,  # half answers lost after delivery, half held past the timeout
    error_rate=0.02,
    kill_rate=0.01,
    stall_rate=0.01,
    seed=20261201,
    deadline=60,
)


def run(database_url: str, channel: str, strategy: Strategy = "kirim", **changes: Any) -> SimResult:
    opts = replace(CHAOS, channel=channel, strategy=strategy, **changes)  # type: ignore[arg-type]
    result = simulate(opts, empty_database=database_url)
    assert not result.timed_out, result
    assert result.worker_crashes == [], result
    assert result.channel == channel
    return result


@pytest.mark.parametrize("channel", ["apns", "fcm", "webpush"])
def test_kirim_pushes_show_once_on_the_device_where_naive_ones_double(
    database_url: str, channel: str
) -> None:
    """Lost answers, kills and stalls: kirim resends (the same collapse id) and the
    device shows every notification once, nothing lost; the naive flow shows some
    twice."""
    r = run(database_url, channel)
    assert (r.duplicates, r.lost, r.unfinished) == (0, 0, 0), r
    assert r.duplicate_requests > 0, "the lost answers should have been resent"


@pytest.mark.parametrize("channel", ["apns", "sms"])
def test_the_naive_flow_shows_some_twice(database_url: str, channel: str) -> None:
    """The same seed and faults on the naive flow (a fresh key per send): some users
    see a notification twice."""
    assert run(database_url, channel, "naive").duplicates > 0


def test_kirim_sms_is_never_resent_on_doubt(database_url: str) -> None:
    """Twilio keeps no key: a lost answer leaves the SMS in doubt (assumed sent),
    never sent twice; the naive flow sends some twice."""
    r = run(database_url, "sms")
    assert (r.duplicates, r.duplicate_requests, r.lost) == (0, 0, 0), r
    assert r.in_doubt > 0, r
    assert r.unreported_in_doubt == 0, r


def test_cli_runs_a_service_channel() -> None:
    """kirim simulate --channel apns --json prints one object with kirim's 0."""
    args = ["--channel", "apns", "--notifications", "60", "--workers", "2", "--lease", "1"]
    args += ["--latency", "fixed:0.01", "--timeout-rate", "0.1", "--kill-rate", "0.02"]
    args += ["--stall-rate", "0", "--seed", "3", "--deadline", "40", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "kirim", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=55,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["channel"], data["duplicates"], data["lost"]) == ("apns", 0, 0)
