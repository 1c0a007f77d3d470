"""``kirim analyze`` reads kirim's own logs exactly: a request the log records as not
sent is no request, the worker's banner is no malformed line, and the text report
shows a short excerpt of each incident's evidence (``--verbose``: all of it)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kirim.analyze.command import analyze

SEED = Path(__file__).resolve().parents[1] / "fixtures" / "seed.log"


def kirim(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KIRIM_DATABASE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "kirim", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: a connection is refused


@pytest.mark.slow
def test_requests_refused_at_connect_are_no_duplicate_risk(tmp_path: Path) -> None:
    """A worker whose every request is refused at connect (logged 'not sent'), banner
    and all, as `kirim worker --burst 2> worker.log` writes it: no duplicate risk, no
    malformed line (main reported 3 risks and counted the banner as 6 malformed lines)."""
    config = tmp_path / "kirim.toml"
    config.write_text(
        f'database = "sqlite:///{tmp_path / "k.db"}"\n'
        "[worker]\nmax_attempts = 3\nbackoff_base = 0.01\nbackoff_max = 0.02\n"
        "poll_interval = 0.05\n"
        f'[channels.push]\nurl = "http://127.0.0.1:{closed_port()}/hook"\n'
    )
    assert kirim(config, "init").returncode == 0
    for n in range(3):
        sent = kirim(config, "send", "--event", f"e{n}", "--recipient", "r", "--channel", "push",
                     "--payload", "{}")  # fmt: skip
        assert sent.returncode == 0, sent.stderr
    worker = kirim(config, "worker", "--burst")
    assert worker.returncode == 0, worker.stderr
    assert worker.stderr.count("event=provider_request") == 9
    log = tmp_path / "worker.log"
    log.write_text(worker.stderr)
    result = CliRunner().invoke(analyze, [str(log), "--format", "json"])
    summary = json.loads(result.stdout)["summary"]
    assert summary["malformed_lines"] == 0
    assert summary["duplicate_risks"] == 0
    assert summary["duplicates"] == 0
    assert summary["notifications"] == 3
    assert result.exit_code == 0


def test_the_banner_is_known() -> None:
    """Every line the worker's banner writes is recognized as the banner."""
    from kirim.cli import render

    facts: dict[str, Any] = {
        "version": "0.2.0", "worker_id": "w-1", "pid": 7, "burst": True,
        "database": "sqlite:///k.db", "config": None, "lease": 30.0, "concurrency": 10,
        "batch_size": 100, "max_attempts": 8, "shutdown_grace": 10.0, "metrics": "http://x",
        "wakeups": "LISTEN/NOTIFY on the database; polls every 1s",
        "channels": [
            {"name": "a", "provider": "webhook", "url": "http://h", "in_doubt": "hold",
             "lookup": True},
            {"name": "b", "provider": "smtp", "url": None, "in_doubt": "retry", "lookup": False},
        ],
    }  # fmt: skip
    import io
    from contextlib import redirect_stderr

    out = io.StringIO()
    with redirect_stderr(out):
        render.show_banner(facts)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 8
    from kirim.analyze.parse import is_banner

    assert all(is_banner(line) for line in lines), lines
    assert not is_banner("ts=2026-12-01T10:00:00Z event=provider_request notification_id=1")


def long_log() -> str:
    """One notification with a proven duplicate among 60 lines of its own."""
    lines = []
    for n in range(60):
        lines.append(
            f"ts=2026-12-01T10:00:{n // 10:02d}.{n % 10}00Z event=job_claimed "
            f"notification_id=n1 job_id=j{n} attempt={n + 1} worker_id=w{n % 2}"
        )
    for n, msg in ((1, "m1"), (2, "m2")):
        lines.append(
            f"ts=2026-12-01T10:01:0{n}.000Z event=provider_request notification_id=n1 "
            f"job_id=j{n} attempt={n} worker_id=w{n} provider_request_id=r{n}"
        )
        lines.append(
            f"ts=2026-12-01T10:01:0{n}.500Z event=provider_response notification_id=n1 "
            f"provider_request_id=r{n} result=success provider_message_id={msg}"
        )
    lines.append("ts=2026-12-01T10:01:03.000Z event=db_update notification_id=n1 status=sent")
    return "\n".join(lines) + "\n"


def test_the_text_report_shows_a_short_excerpt(tmp_path: Path) -> None:
    """An incident's evidence in the text report is a few lines (the requests and
    answers), and says how many more --verbose shows; --verbose shows them all (main
    printed every kept line of every incident: 534 lines for 3 incidents)."""
    log = tmp_path / "app.log"
    log.write_text(long_log())
    short = CliRunner().invoke(analyze, [str(log)])
    assert short.exit_code == 1
    assert "provider_request_id=r1" in short.stdout
    assert "provider_request_id=r2" in short.stdout
    assert short.stdout.count("event=job_claimed") <= 4
    assert "--verbose" in short.stdout
    full = CliRunner().invoke(analyze, [str(log), "--verbose"])
    assert full.stdout.count("event=job_claimed") >= 30
    assert len(full.stdout.splitlines()) >= len(short.stdout.splitlines()) + 30
