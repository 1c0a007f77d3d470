"""`kirim doctor` from the command line, and its checks that need no database."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kirim.channels import Channel
from kirim.cli import main
from kirim.config import parse_config
from kirim.doctor.checks import _dedup_windows, retry_horizon
from kirim.engine import Kirim
from kirim.errors import ConfigError
from kirim.testing import FlakyProvider, ManualClock

CHANNEL = '[channels.push]\nprovider = "kirim.testing:FlakyProvider"\n'


def doctor(tmp_path: Path, config: str, *args: str) -> Result:
    path = tmp_path / "kirim.toml"
    path.write_text(f'database = "sqlite:///{tmp_path / "k.db"}"\n{config}')
    return CliRunner().invoke(main, ["--config", str(path), *args])


def init(tmp_path: Path, config: str = CHANNEL) -> None:
    assert doctor(tmp_path, config, "init").exit_code == 0


def test_retry_horizon_sums_the_capped_backoffs() -> None:
    """The horizon is the sum of the largest backoffs between max_attempts attempts."""
    assert retry_horizon(parse_config({})) == 1 + 2 + 4 + 8 + 16 + 32 + 64
    capped = parse_config({"worker": {"max_attempts": 8, "backoff_max": 10}})
    assert retry_horizon(capped) == 1 + 2 + 4 + 8 + 10 + 10 + 10
    assert retry_horizon(parse_config({"worker": {"max_attempts": 1}})) == 0


def test_a_dedup_window_shorter_than_the_horizon_is_a_warning() -> None:
    """A provider that forgets keys before kirim stops retrying: warning with the numbers."""
    config = parse_config(
        {
            "worker": {"max_attempts": 5, "backoff_base": 60, "backoff_max": 600},
            "channels": {
                "email": {"provider": "kirim.testing:FlakyProvider", "dedup_window": 600},
                "sms": {"provider": "kirim.testing:FlakyProvider", "dedup_window": 86400},
            },
        }
    )
    email, sms = _dedup_windows(config)
    assert (email.name, email.status) == ("dedup_window.email", "warning")
    assert "remembers a key for 600 s, kirim may retry up to 900 s after the first" in (
        email.message
    )
    assert "max_attempts or backoff_max" in email.fix
    assert (sms.name, sms.status) == ("dedup_window.sms", "ok")


def test_without_dedup_windows_the_check_is_skipped() -> None:
    """No channel gives a window: skipped, saying how to give one."""
    (check,) = _dedup_windows(parse_config({}))
    assert check.status == "skipped"
    assert "dedup_window = SECONDS" in check.fix


def test_dedup_window_is_a_channel_option_not_a_provider_argument() -> None:
    """dedup_window is validated and kept out of the provider factory's arguments."""
    config = parse_config(
        {"channels": {"push": {"provider": "kirim.testing:FlakyProvider", "dedup_window": 60}}}
    )
    assert config.channels["push"].dedup_window == 60.0
    assert "dedup_window" not in config.channels["push"].options
    assert isinstance(config.channels["push"].build().provider, FlakyProvider)
    for bad in (0, -5, "1d", True):
        with pytest.raises(ConfigError, match="dedup_window"):
            parse_config({"channels": {"push": {"provider": "x:y", "dedup_window": bad}}})


def test_a_healthy_store_exits_0_with_every_check(tmp_path) -> None:
    """A fresh store: exit 0, one line per check and the tally."""
    init(tmp_path)
    done = doctor(tmp_path, CHANNEL, "doctor")
    assert done.exit_code == 0, done.output
    for name in (
        "schema",
        "unique_idempotency_key",
        "stuck_processing",
        "in_doubt",
        "dead_letters",
        "lease_vs_latency",
        "clock_skew",
        "dedup_window",
    ):
        assert f" {name} " in done.output
    assert done.output.rstrip().endswith("0 problems, 0 warnings")


def test_warnings_alone_exit_0(tmp_path) -> None:
    """A too-short dedup window is a warning: reported, and still exit 0."""
    config = CHANNEL + "dedup_window = 10\n"
    init(tmp_path, config)
    done = doctor(tmp_path, config, "doctor", "--json")
    assert done.exit_code == 0
    report = json.loads(done.stdout)
    assert report["ok"] is True
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["dedup_window.push"] == "warning"
    assert all(set(c) == {"name", "status", "message", "fix"} for c in report["checks"])


def test_a_claim_expired_long_ago_fails_the_doctor(tmp_path) -> None:
    """A claim made an hour ago (a manual clock) and never reaped: exit 1, stuck_processing."""
    init(tmp_path)
    clock = ManualClock(start=time.time() - 3600)

    async def claim_in_the_past() -> None:
        channels = {"push": Channel(name="push", provider=FlakyProvider())}
        app = Kirim(
            parse_config({"database": f"sqlite:///{tmp_path / 'k.db'}"}),
            channels=channels,
            clock=clock,
        )
        await app.open()
        try:
            await app.notify("e", "u", "push", {})
            await app.store.claim(worker_id="gone", now=clock.now(), lease=30, limit=1)
        finally:
            await app.close()

    asyncio.run(claim_in_the_past())
    done = doctor(tmp_path, CHANNEL, "doctor")
    assert done.exit_code == 1
    line = next(x for x in done.output.splitlines() if "stuck_processing" in x)
    assert line.split()[0] == "PROBLEM"
    assert "1 delivery stuck in processing" in line
    assert "fix: start a worker (`kirim worker`)" in done.output


def test_a_database_that_does_not_exist_is_a_usage_error(tmp_path) -> None:
    """The doctor never creates a database: a missing SQLite file exits 2."""
    done = doctor(tmp_path, CHANNEL, "doctor")
    assert done.exit_code == 2
    assert "no SQLite database at" in done.output
    assert not (tmp_path / "k.db").exists()


def test_table_and_key_go_together(tmp_path) -> None:
    """--table without --key (or the reverse) exits 2."""
    init(tmp_path)
    for args in (["--table", "t"], ["--key", "a,b"]):
        done = doctor(tmp_path, CHANNEL, "doctor", *args)
        assert done.exit_code == 2
        assert "--table and --key go together" in done.output


def test_doctor_is_listed_in_the_help() -> None:
    """`kirim --help` lists doctor; `kirim doctor --help` shows the audit form."""
    assert " doctor " in CliRunner().invoke(main, ["--help"]).output
    help_text = CliRunner().invoke(main, ["doctor", "--help"]).output
    assert "--table TABLE" in help_text
    assert "--key COLS" in help_text
