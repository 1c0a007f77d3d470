"""``kirim bench --sync`` and the raw SQLite baseline of ``make bench`` (bench/raw.py).

Real runs on small numbers (worker processes, temporary SQLite files); no timing is
asserted, only what was delivered or completed and what the durability says.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bench_scripts import BENCH, load
from kirim.cli import main


@pytest.mark.slow
def test_bench_sync_normal_runs_at_normal() -> None:
    """--sync normal delivers everything and the durability field says synchronous=normal."""
    result = CliRunner().invoke(
        main,
        ["bench", "--sync", "normal", "--notifications", "50", "--workers", "1", "--json"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["delivered"] == 50
    assert "synchronous=normal" in out["durability"]
    assert out["durability"].startswith("WAL")
    assert out["deliveries_per_s"] > 0
    assert out["enqueues_per_s"] > 0
    assert isinstance(out["worker_cpu_us_per_delivery"], float)
    assert "wal_bytes_per_delivery" not in out  # PostgreSQL's figures only there


@pytest.mark.parametrize("where", ["command", "group"])
def test_bench_sync_refuses_postgresql(where: str) -> None:
    """--sync with a PostgreSQL URL (on the command or the group) is a usage error, exit 2,
    before anything connects (no server is needed)."""
    url = "postgresql://nobody@127.0.0.1:1/none"
    args = ["bench", "--sync", "normal", "--notifications", "5"]
    argv = [*args, "--database", url] if where == "command" else ["--database", url, *args]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2, result.output
    assert "--sync" in result.stderr
    assert "PostgreSQL" in result.stderr


def test_run_bench_refuses_sync_on_postgresql() -> None:
    """run_bench itself refuses sync for PostgreSQL, and a setting it does not know."""
    from kirim.devtools.bench import run_bench
    from kirim.errors import ConfigError

    with pytest.raises(ConfigError, match="PostgreSQL"):
        run_bench("postgresql://nobody@127.0.0.1:1/none", 5, 1, sync="normal")
    with pytest.raises(ConfigError, match="sync must be one of"):
        run_bench(None, 5, 1, sync="off")


def test_with_sync_sets_the_query() -> None:
    """The URL keeps its path (absolute or relative) and other parameters; a synchronous
    it had is replaced."""
    from kirim.devtools.bench import with_sync

    assert with_sync("sqlite:////tmp/a.db", "normal") == "sqlite:////tmp/a.db?synchronous=normal"
    assert with_sync("sqlite:///a.db?synchronous=full", "normal") == (
        "sqlite:///a.db?synchronous=normal"
    )
    assert with_sync("sqlite:///a.db?x=1&synchronous=off", "full") == (
        "sqlite:///a.db?x=1&synchronous=full"
    )


def test_sqlite_raw_completes_every_job() -> None:
    """The raw one-by-one loop claims and completes all 200 jobs, and inserts 200
    delivery + job rows."""
    out = load("raw").sqlite_raw(200, "normal")
    assert out["completed"] == 200
    assert out["claimed"] == 200
    assert out["claims_per_s"] > 0
    assert out["inserted"] == 200
    assert out["executemany_inserts_per_s"] > 0
    assert out["durability"] == "WAL, synchronous=normal"


@pytest.mark.slow
def test_bench_on_postgresql_reports_wal_and_hot_ratios() -> None:
    """On PostgreSQL the result has the worker CPU per delivery, the server-wide WAL
    bytes per delivery and, for the three hot tables, updates per delivery and a HOT
    ratio between 0 and 1 (their values are not asserted)."""
    from pg import ADMIN_URL, reachable

    why = reachable()
    if why is not None:
        pytest.skip(f"no PostgreSQL server: {why}")
    from kirim.devtools.bench import run_bench

    out = run_bench(ADMIN_URL, 300, 1)
    assert out["delivered"] == 300
    assert out["worker_cpu_us_per_delivery"] > 0
    assert out["wal_bytes_per_delivery"] > 0
    assert "server-wide" in out["wal_scope"]
    assert out["server_cpu_us_per_delivery"] > 0  # the test server runs on this host
    assert "server-wide" in out["server_cpu_scope"]
    for table in ("kirim_deliveries", "kirim_jobs", "kirim_attempts"):
        assert out[f"updates_per_delivery_{table}"] > 0  # counters flushed before read
        assert 0 <= out[f"hot_ratio_{table}"] <= 1


def test_pg_figures_from_two_snapshots() -> None:
    """WAL bytes and updates are per delivery, the HOT ratio is HOT updates over
    updates between the snapshots, and None for a table without updates."""
    from kirim.devtools.pgfigures import Snapshot, figures

    before = Snapshot(wal=1000, updates={"kirim_deliveries": (10, 5), "kirim_jobs": (0, 0)})
    after = Snapshot(wal=5000, updates={"kirim_deliveries": (30, 10), "kirim_jobs": (0, 0)})
    out = figures(before, after, 10)
    assert out["wal_bytes_per_delivery"] == 400.0
    assert out["updates_per_delivery_kirim_deliveries"] == 2.0
    assert out["hot_ratio_kirim_deliveries"] == 0.25
    assert out["hot_ratio_kirim_jobs"] is None
    assert out["hot_ratio_kirim_attempts"] is None


def test_pg_figures_count_the_servers_cpu_per_delivery() -> None:
    from kirim.devtools.pgfigures import Snapshot, figures

    before = Snapshot(wal=0, updates={}, cpu=10.0, cpu_why="server-wide")
    after = Snapshot(wal=0, updates={}, cpu=10.5, cpu_why="server-wide")
    out = figures(before, after, 1000)
    assert out["server_cpu_us_per_delivery"] == 500.0
    assert out["server_cpu_scope"] == "server-wide"
    away = Snapshot(wal=0, updates={}, cpu=None, cpu_why="not measured: elsewhere")
    out = figures(away, away, 1000)
    assert out["server_cpu_us_per_delivery"] is None
    assert out["server_cpu_scope"] == "not measured: elsewhere"


def _process(proc: Path, pid: int, ppid: int, cmdline: str, times: tuple[int, ...]) -> None:
    """A process in a /proc-shaped folder: its stat (utime, stime, cutime, cstime in
    clock ticks) and its command line."""
    folder = proc / str(pid)
    folder.mkdir()
    middle = " ".join(["0"] * 9)  # pgrp .. cmajflt, fields 5 to 13
    utime, stime, cutime, cstime = times
    (folder / "stat").write_text(
        f"{pid} (postgres) S {ppid} {middle} {utime} {stime} {cutime} {cstime} 20 0 1\n"
    )
    (folder / "cmdline").write_bytes(cmdline.encode().replace(b" ", b"\0"))


def test_the_servers_cpu_is_its_main_process_and_all_its_children(tmp_path: Path) -> None:
    """The postmaster's own time and its reaped children's, and each live child's;
    nothing of a process that is not its child; None where the backend named is not
    this server's session (another host's numbers)."""
    import os

    from kirim.devtools.pgfigures import server_cpu

    tick = os.sysconf("SC_CLK_TCK")
    _process(tmp_path, 100, 1, "/usr/lib/postgresql/15/bin/postgres -D x", (5, 5, 300, 100))
    _process(
        tmp_path, 200, 100, "postgres: 15/main: postgres kirim_b 127.0.0.1(1) idle", (7, 3, 0, 0)
    )
    _process(tmp_path, 201, 100, "postgres: 15/main: walwriter", (2, 2, 0, 0))
    _process(tmp_path, 300, 1, "python worker.py", (900, 900, 0, 0))
    (tmp_path / "self").mkdir()
    seconds, scope = server_cpu(200, "kirim_b", tmp_path)
    assert seconds == (5 + 5 + 300 + 100 + 7 + 3 + 2 + 2) / tick
    assert "server-wide" in scope
    for backend, database in ((200, "kirim_other"), (300, "kirim_b"), (999, "kirim_b")):
        seconds, scope = server_cpu(backend, database, tmp_path)
        assert seconds is None
        assert scope.startswith("not measured")


def _script_on_postgres(script: str, *args: str) -> list[dict[str, Any]]:
    """The JSON lines ``bench/<script>`` prints, run on the test server with ``args``
    (skips without a server; fails, with its stderr, if the script does)."""
    import subprocess

    from pg import ADMIN_URL, reachable

    why = reachable()
    if why is not None:
        pytest.skip(f"no PostgreSQL server: {why}")
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args, "--database", ADMIN_URL],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.slow
def test_plans_at_scale_reports_each_statement() -> None:
    """bench/plans_at_scale.py on the smallest ledger its batch fits: a line per
    statement, the backlog's claim reading no more than its batch, no table scanned."""
    import uuid

    name = f"kirim_plans_{uuid.uuid4().hex[:8]}"
    found = _script_on_postgres("plans_at_scale.py", "--rows", "10000", "--name", name)
    lines = {row["statement"]: row for row in found}
    assert {"finish_fenced", "insert_intents", "claim_fresh (backlog)"} <= set(lines)
    for statement in ("due_jobs (backlog)", "claim_fresh (backlog)"):
        assert lines[statement]["most_rows_read"] == 256, lines[statement]
        assert lines[statement]["seq_scans"] == [], lines[statement]


@pytest.mark.slow
@pytest.mark.parametrize("lean", [False, True])
def test_claim_variants_measures_each_variant(lean: bool) -> None:
    """bench/claim_variants.py on a small queue: each variant claims a batch and its
    WAL is counted; writing the job alone writes less WAL than both rows."""
    options = ["--deliveries", "600", "--runs", "2"] + (["--no-status-indexes"] if lean else [])
    rows = {row["variant"]: row for row in _script_on_postgres("claim_variants.py", *options)}
    assert set(rows) == {"both rows", "job only"}
    assert all(row["us_per_delivery"] > 0 for row in rows.values())
    assert rows["job only"]["wal_bytes_per_delivery"] < rows["both rows"]["wal_bytes_per_delivery"]
