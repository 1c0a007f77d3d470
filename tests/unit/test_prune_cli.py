"""`kirim prune` on a real SQLite file, the [retention] table, and `kirim doctor`'s
retention check."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kirim.channels import Channel
from kirim.cli import main
from kirim.config import Config, parse_config
from kirim.doctor.checks import _retention
from kirim.engine import Kirim
from kirim.errors import ConfigError
from kirim.observe.logging import configure
from kirim.testing import FlakyProvider, ManualClock

DAY = 86_400.0
CHANNEL = '[channels.push]\nprovider = "kirim.testing:FlakyProvider"\n'


@pytest.fixture(autouse=True)
def _quiet_logs(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("KIRIM_DATABASE_URL", raising=False)
    yield
    configure(level="warning")


def kirim(tmp_path: Path, config: str, *args: str) -> Result:
    path = tmp_path / "kirim.toml"
    path.write_text(f'database = "sqlite:///{tmp_path / "k.db"}"\n{CHANNEL}{config}')
    return CliRunner().invoke(main, ["--config", str(path), *args])


def delivered(tmp_path: Path, keys: list[str], *, days_ago: float) -> None:
    """Deliveries sent ``days_ago`` (a manual clock), through the real store and worker."""

    async def go() -> None:
        clock = ManualClock(time.time() - days_ago * DAY)
        channel = Channel(name="push", provider=FlakyProvider())
        config = Config(database=f"sqlite:///{tmp_path / 'k.db'}")
        async with Kirim(config, channels={"push": channel}, clock=clock) as app:
            for key in keys:
                await app.notify("e", "u", "push", {"k": key}, key=key)
            await app.worker().run(burst=True)

    asyncio.run(go())


def table(tmp_path: Path, name: str) -> int:
    with sqlite3.connect(tmp_path / "k.db") as db:
        return int(db.execute(f"SELECT count(*) FROM {name}").fetchone()[0])


def test_prune_dry_run_counts_then_prune_deletes(tmp_path: Path) -> None:
    """--dry-run counts and deletes nothing; then prune deletes, a line per batch on
    stderr and the totals on stdout (--json too)."""
    assert kirim(tmp_path, "", "init").exit_code == 0
    delivered(tmp_path, ["a", "b", "c"], days_ago=60)
    delivered(tmp_path, ["new"], days_ago=0)
    dry = kirim(tmp_path, "", "prune", "--dry-run", "--keep", "30d", "--json")
    assert dry.exit_code == 0, dry.output
    counted = json.loads(dry.stdout)
    assert counted["dry_run"] is True
    assert (counted["deliveries"], counted["jobs"], counted["attempts"]) == (3, 3, 3)
    assert counted["keep_s"] == 30 * DAY
    assert table(tmp_path, "kirim_deliveries") == 4
    text = kirim(tmp_path, "", "prune", "--dry-run", "--keep", "30d")
    assert text.stdout.startswith("would prune 3 deliveries (3 jobs, 3 attempts")
    done = kirim(tmp_path, "", "prune", "--keep", "30d", "--batch", "2")
    assert done.exit_code == 0, done.output
    assert done.stderr.splitlines()[:2] == [
        "prune: batch 1: 2 deliveries (2 jobs, 2 attempts, 0 HTTP request rows), 0 expired keys",
        "prune: batch 2: 1 delivery (1 job, 1 attempt, 0 HTTP request rows), 0 expired keys",
    ]
    assert done.stdout.startswith("pruned 3 deliveries (3 jobs, 3 attempts")
    assert (table(tmp_path, "kirim_deliveries"), table(tmp_path, "kirim_key_tombstones")) == (1, 3)


def test_without_a_retention_prune_exits_2(tmp_path: Path) -> None:
    """No --keep and no [retention] keep: exit 2 with a line that says what to give."""
    assert kirim(tmp_path, "", "init").exit_code == 0
    refused = kirim(tmp_path, "", "prune", "--dry-run")
    assert refused.exit_code == 2
    assert "--keep" in refused.stderr
    assert "[retention]" in refused.stderr
    assert kirim(tmp_path, "", "prune", "--keep", "soon").exit_code == 2


def test_the_config_gives_prune_its_defaults(tmp_path: Path) -> None:
    """[retention] keep and keys, durations or seconds, are prune's defaults."""
    config = '[retention]\nkeep = "30d"\nkeys = 3600\n'
    assert kirim(tmp_path, config, "init").exit_code == 0
    delivered(tmp_path, ["a"], days_ago=60)
    delivered(tmp_path, ["new"], days_ago=0)
    done = kirim(tmp_path, config, "prune", "--dry-run", "--json")
    assert done.exit_code == 0, done.output
    found = json.loads(done.stdout)
    assert (found["deliveries"], found["keep_s"], found["keys_s"]) == (1, 30 * DAY, 3600)


def test_the_retention_table_is_checked() -> None:
    """[retention] takes keep and keys only, each a duration or seconds in range."""
    config = parse_config({"retention": {"keep": "12h", "keys": "1d"}})
    assert (config.worker.retention_keep, config.worker.retention_keys) == (43_200, DAY)
    assert parse_config({}).worker.retention_keep is None
    assert parse_config({}).worker.retention_keys == 365 * DAY
    for bad in ({"keep": "soon"}, {"keep": 0}, {"keys": -1}, {"keep": True}, {"kept": "1d"}):
        with pytest.raises(ConfigError, match="retention"):
            parse_config({"retention": bad})
    with pytest.raises(ConfigError, match="retention_keep"):
        parse_config({"worker": {"retention_keep": 60}})


# -- kirim doctor ------------------------------------------------------------------------


def test_doctor_warns_when_keep_is_shorter_than_a_dedup_window_or_the_horizon(
    tmp_path: Path,
) -> None:
    """A retention shorter than a channel's dedup window (or the retry horizon) is a
    warning: reported with the fix, and doctor still exits 0."""
    config = 'dedup = "onesignal"\n[retention]\nkeep = "7d"\n'
    assert kirim(tmp_path, config, "init").exit_code == 0
    done = kirim(tmp_path, config, "doctor", "--json")
    assert done.exit_code == 0, done.output
    (check,) = [c for c in json.loads(done.stdout)["checks"] if c["name"] == "retention"]
    assert check["status"] == "warning"
    assert "channel push's dedup window (30d)" in check["message"]
    assert 'keep = "30d"' in check["fix"]
    short = _retention(parse_config({"retention": {"keep": "60s"}}))
    assert short.status == "warning"
    assert "retry horizon" in short.message
    assert _retention(parse_config({"retention": {"keep": "30d"}})).status == "ok"
    assert _retention(parse_config({})).status == "skipped"


def test_the_summary_names_the_notification_rows_only_when_there_were_any() -> None:
    from kirim.cli.prune import summary
    from kirim.store.retention import PruneResult

    plain = summary(PruneResult(deliveries=2, tombstones_written=2))
    assert "digests" not in plain
    assert "throttle" not in plain
    some = summary(PruneResult(digests=1, digest_events=3, throttle_expired=4, dry_run=True))
    assert "1 digest (3 events emptied, 0 expired), 4 throttle counters" in some
    assert some.endswith("(nothing was deleted: --dry-run)")


def test_the_summary_names_runs_and_topic_rows_only_when_there_were_any() -> None:
    """Runs, topic events, ended subscriptions and their expired keys are named when a
    round took any, after the notification layer's rows or alone."""
    from kirim.cli.prune import summary
    from kirim.store.retention import PruneResult

    assert "runs" not in summary(PruneResult(deliveries=2, tombstones_written=2))
    alone = summary(PruneResult(runs=2, run_steps=5, subscriptions=1))
    assert alone.endswith(
        "; 2 runs (5 steps), 0 topic events, 1 ended subscription, "
        "0 expired run or topic event keys"
    )
    windows = summary(PruneResult(runs=2, run_steps=5, run_digests=1))
    assert "; 2 runs (5 steps, 1 digest window), 0 topic events" in windows
    both = summary(PruneResult(feed_items=1, topic_events=3, dry_run=True))
    assert "1 feed message; 0 runs (0 steps), 3 topic events" in both
