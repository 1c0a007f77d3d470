"""Operating kirim as a process: closed pipes, unreachable databases, the test receiver,
progress of the long commands, and kirim used as a library (real subprocesses)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _env() -> dict[str, str]:
    """This environment without KIRIM_* settings (PYTHONPATH, if any, is kept)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("KIRIM_")}


def _kirim(*args: str) -> list[str]:
    return [sys.executable, "-m", "kirim", *args]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A directory with a kirim.toml (one webhook channel to a closed port) and its schema."""
    (tmp_path / "kirim.toml").write_text(
        f'database = "sqlite:///{tmp_path / "k.db"}"\n'
        '[channels.push]\nprovider = "webhook"\nurl = "http://127.0.0.1:9/push"\n'
    )
    done = subprocess.run(
        _kirim("--config", str(tmp_path / "kirim.toml"), "init"),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return tmp_path


# -- 11: a closed stdout/stderr does not stop shutdown ---------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_worker_exits_on_a_signal_after_the_reader_of_its_output_went_away(
    folder: Path, sig: signal.Signals
) -> None:
    """`kirim worker 2>&1 | head -1`: once the pipe's reader is gone, SIGTERM or SIGINT
    still stops the worker, with exit status 0."""
    with subprocess.Popen(
        _kirim("--config", str(folder / "kirim.toml"), "worker"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=_env(),
    ) as proc:
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()  # `head -1`
            assert first, "the worker wrote nothing"
            proc.stdout.close()  # ... and head exits
            time.sleep(0.5)
            assert proc.poll() is None, "the worker died of its closed output"
            proc.send_signal(sig)
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


# -- 12: an unreachable PostgreSQL is one line, exit 2, fast ---------------------------


def _one_line_exit_2(url: str, within: float) -> str:
    started = time.monotonic()
    done = subprocess.run(
        _kirim("--database", url, "list"), env=_env(), capture_output=True, text=True, timeout=60
    )
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    assert took < within, f"{took:.1f}s"
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: PostgreSQL: cannot connect to ")
    return lines[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_postgres_port_with_no_server_is_one_line_and_exit_2_at_once() -> None:
    """A URL to a port nobody listens on fails at once: one line, exit status 2."""
    line = _one_line_exit_2(f"postgresql://kirim:pw@127.0.0.1:{_free_port()}/app", within=5)
    assert "Connection refused" in line
    assert ":pw@" not in line
    assert "kirim:***@" in line


def test_a_missing_postgres_database_is_one_line_and_exit_2_at_once() -> None:
    """A URL to a database that does not exist fails at once: one line, exit status 2."""
    from pg import ADMIN_URL, reachable

    why = reachable()
    if why is not None:
        pytest.skip(f"no PostgreSQL server: {why}")
    missing = ADMIN_URL.rsplit("/", 1)[0] + f"/kirim_missing_{secrets.token_hex(4)}"
    line = _one_line_exit_2(missing, within=5)
    assert "does not exist" in line


def test_connect_timeout_in_the_url_bounds_the_wait_for_a_silent_server() -> None:
    """A server that accepts and never answers is given the URL's connect_timeout, not
    the pool's ten seconds of retries."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel accepts; nobody ever answers
        port = silent.getsockname()[1]
        line = _one_line_exit_2(
            f"postgresql://postgres@127.0.0.1:{port}/app?connect_timeout=2", within=6
        )
    assert "timeout" in line


# -- README: python -m kirim.receiver ---------------------------------------------------


def test_python_m_kirim_receiver_serves_on_loopback_until_sigint() -> None:
    """python -m kirim.receiver --port 0 says where it listens, answers a POST, counts
    it, and stops on Ctrl-C (SIGINT) with exit status 0."""
    with subprocess.Popen(
        [sys.executable, "-m", "kirim.receiver", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    ) as proc:
        _use_the_receiver(proc)


def _use_the_receiver(proc: subprocess.Popen[str]) -> None:
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.startswith("kirim receiver on http://127.0.0.1:"), first
        base = first.split()[3].rstrip("/")
        body = json.dumps({"event_id": "e", "recipient": "r", "channel": "push"}).encode()
        post = urllib.request.Request(
            f"{base}/push", data=body, headers={"Idempotency-Key": "k-1"}, method="POST"
        )
        with urllib.request.urlopen(post, timeout=10) as answer:
            assert answer.status == 200
            assert json.loads(answer.read())["id"].startswith("p-")
        assert "1 request, 1 notification" in proc.stderr.readline()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert "stopped: 1 request," in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


# -- README: progress of bench and simulate on stderr ----------------------------------


def _stderr_lines(argv: list[str], cwd: Path) -> list[tuple[str, bool]]:
    """Each stderr line of ``argv`` (stdout discarded) with whether the process was still
    running when the line came; the process must exit 0."""
    lines = []
    with subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env()
    ) as proc:
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append((line, proc.poll() is None))
            assert proc.wait(timeout=60) == 0, "".join(line for line, _ in lines)
        finally:
            if proc.poll() is None:
                proc.kill()
    return lines


def test_bench_prints_progress_on_stderr_while_it_runs(tmp_path: Path) -> None:
    """kirim bench says on stderr what it is doing before it prints its result."""
    argv = _kirim("bench", "--notifications", "500", "--workers", "1", "--json")
    lines = list(_stderr_lines(argv, tmp_path))
    assert lines, "no progress on stderr"
    first, running = lines[0]
    assert first.startswith("bench: enqueueing 500 notifications")
    assert running, "the first progress line came only at the end"
    assert any("500 delivered in" in line for line, _ in lines)


def test_simulate_prints_progress_on_stderr_while_it_runs(tmp_path: Path) -> None:
    """kirim simulate reports deliveries so far on stderr while the run goes."""
    argv = _kirim(
        "simulate", "--notifications", "40", "--workers", "1", "--kill-rate", "0",
        "--stall-rate", "0", "--timeout-rate", "0", "--error-rate", "0",
        "--latency", "fixed:0.01", "--seed", "1", "--json",
    )  # fmt: skip
    lines = list(_stderr_lines(argv, tmp_path))
    progress = [(line, running) for line, running in lines if line.startswith("simulate (kirim)")]
    assert progress, [line for line, _ in lines]
    assert progress[0][1], "the first progress line came only at the end"
    assert any("40/40 delivered" in line for line, _ in progress)


# -- 17: as a library, kirim leaves the output to the application ----------------------

LIBRARY = """
import logging, sys
from kirim import Channel, Config, NotifyRequest, SyncKirim
from kirim.testing import NullProvider
if sys.argv[2] == "configured":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(message)s")
channels = {"push": Channel(name="push", provider=NullProvider())}
app = SyncKirim(Config(database=sys.argv[1]), channels=channels).open(migrate=True)
app.notify("48291", "1007", "push", {"t": 1})
app.notify_many([NotifyRequest(event_id="48292", recipient="1007", channel="push", payload={})])
app._run(app.app.worker().run(burst=True))
app.close()
"""


@pytest.mark.parametrize("logging_", ["silent", "configured"])
def test_library_use_prints_nothing_unless_the_application_configures_logging(
    tmp_path: Path, logging_: str
) -> None:
    """notify() and a worker in an application print nothing to stdout or stderr; once the
    application configures logging, kirim's events reach it through the stdlib."""
    script = tmp_path / "app.py"
    script.write_text(LIBRARY)
    database = f"sqlite:///{tmp_path / 'k.db'}"
    done = subprocess.run(
        [sys.executable, str(script), database, logging_],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    if logging_ == "silent":
        assert done.stderr == ""
    else:
        assert "kirim event=enqueued notification_id=1" in done.stderr
        assert "kirim event=db_update" in done.stderr


# -- README: SyncKirim has notify_many and connection= ---------------------------------


def _sync_app(database: str) -> Any:
    from kirim import Channel, Config, SyncKirim
    from kirim.testing import NullProvider

    channels = {"push": Channel(name="push", provider=NullProvider())}
    return SyncKirim(Config(database=database), channels=channels).open(migrate=True)


def test_sync_kirim_notify_many_records_a_batch(tmp_path: Path) -> None:
    """SyncKirim.notify_many records every request of the batch, and again finds them."""
    from kirim import NotifyRequest

    app = _sync_app(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        batch = [
            NotifyRequest(event_id="48292", recipient=r, channel="push", payload={"n": 1})
            for r in ("1007", "1008")
        ]
        made = app.notify_many(batch)
        assert [n.created for n in made] == [True, True]
        assert [n.created for n in app.notify_many(batch)] == [False, False]
        assert app.get(made[1].delivery_id) is not None
    finally:
        app.close()


def test_sync_kirim_notify_joins_the_transaction_of_a_sync_psycopg_connection(
    request: pytest.FixtureRequest,
) -> None:
    """SyncKirim.notify(connection=conn) with a plain psycopg.Connection writes in the
    caller's transaction: kept on commit, gone on rollback."""
    import psycopg

    from pg import fresh_database

    url = fresh_database(request)
    app = _sync_app(url)
    try:
        with psycopg.connect(url) as conn:
            with conn.transaction():
                kept = app.notify("e-1", "u", "push", {"t": 1}, connection=conn)
            with conn.transaction(force_rollback=True):
                gone = app.notify("e-2", "u", "push", {"t": 2}, connection=conn)
        assert app.get(f"{kept.idempotency_key}") is not None
        assert app.get(f"{gone.idempotency_key}") is None
    finally:
        app.close()
