"""`kirim token` and `kirim serve` from the command line (SQLite)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result

from http_kit import BODY, free_port
from kirim.cli import main
from kirim.observe.logging import configure
from kirim.store.base import SCHEMA_VERSION
from kirim.tokens import hash_token

CONFIG = '[channels.push]\nprovider = "webhook"\nurl = "http://127.0.0.1:9/push"\n'


@pytest.fixture(autouse=True)
def _quiet_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("KIRIM_DATABASE_URL", raising=False)
    yield
    configure(level="warning")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "kirim.toml").write_text(f'database = "sqlite:///{tmp_path / "k.db"}"\n{CONFIG}')
    return tmp_path


def kirim(folder: Path, *args: str) -> Result:
    return CliRunner().invoke(
        main, ["--config", str(folder / "kirim.toml"), *args], catch_exceptions=False
    )


@pytest.fixture
def ready(folder: Path) -> Path:
    assert kirim(folder, "init").exit_code == 0
    return folder


def test_token_create_prints_the_token_once_on_its_last_line(ready: Path) -> None:
    """The token is the last line; the database keeps only its sha256."""
    result = kirim(ready, "token", "create", "--name", "billing")
    assert result.exit_code == 0, result.stderr
    secret = result.stdout.strip().splitlines()[-1]
    assert secret.startswith("kirim_")
    assert " " not in secret
    with sqlite3.connect(ready / "k.db") as conn:
        rows = conn.execute("SELECT name, token_hash, prefix FROM kirim_tokens").fetchall()
    assert rows == [("billing", hash_token(secret), secret[:10])]
    dump = (ready / "k.db").read_bytes()
    assert secret.encode() not in dump
    listed = kirim(ready, "token", "list")
    assert secret not in listed.stdout
    assert "billing" in listed.stdout


def test_token_create_json_and_a_taken_name(ready: Path) -> None:
    """--json gives the token in one object; a name already active exits 2."""
    made = json.loads(kirim(ready, "token", "create", "--name", "ci", "--json").stdout)
    assert made["name"] == "ci"
    assert made["token"].startswith("kirim_")
    again = kirim(ready, "token", "create", "--name", "ci")
    assert again.exit_code == 2
    assert again.stderr.count("\n") == 1
    assert "already exists" in again.stderr
    bad = kirim(ready, "token", "create", "--name", "has space")
    assert bad.exit_code == 2
    assert "token name" in bad.stderr


def test_token_revoke_and_list(ready: Path) -> None:
    """Revoke by name or id; revoked tokens show with --all; a missing one exits 1."""
    kirim(ready, "token", "create", "--name", "a")
    kirim(ready, "token", "create", "--name", "b")
    assert kirim(ready, "token", "revoke", "a").exit_code == 0
    listed = json.loads(kirim(ready, "token", "list", "--json").stdout)
    assert [t["name"] for t in listed] == ["b"]
    assert kirim(ready, "token", "revoke", str(listed[0]["id"])).exit_code == 0
    assert json.loads(kirim(ready, "token", "list", "--json").stdout) == []
    everything = json.loads(kirim(ready, "token", "list", "--all", "--json").stdout)
    assert [t["name"] for t in everything] == ["a", "b"]
    assert all(t["revoked_at"] for t in everything)
    missing = kirim(ready, "token", "revoke", "a")
    assert missing.exit_code == 1
    assert "no active token" in missing.stderr


def test_serve_refuses_a_database_without_schema(folder: Path) -> None:
    """One line naming `kirim init`, exit 2, before anything listens."""
    result = kirim(folder, "serve", "--port", "0")
    assert result.exit_code == 2
    assert "kirim init" in result.stderr
    assert result.stderr.count("\n") == 1


def test_serve_help_lists_the_routes(folder: Path) -> None:
    result = kirim(folder, "serve", "--help")
    assert result.exit_code == 0
    assert "/v1/notifications" in result.stdout
    assert "--protect-dashboard" in result.stdout


@pytest.mark.slow
def test_kirim_serve_serves_and_stops_on_sigterm(ready: Path) -> None:
    """A real `kirim serve` process: records a notification, never logs the token,
    and exits 0 on SIGTERM."""
    secret = kirim(ready, "token", "create", "--name", "ci").stdout.strip().splitlines()[-1]
    port = free_port()
    command = [sys.executable, "-m", "kirim", "--config", str(ready / "kirim.toml"), "serve"]
    process = subprocess.Popen(
        [*command, "--port", str(port)],
        cwd=ready,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        headers = {"Authorization": f"Bearer {secret}", "Idempotency-Key": "cli-1"}
        first = httpx.post(f"{base}/v1/notifications", json=BODY, headers=headers)
        assert first.status_code == 201
        replay = httpx.post(f"{base}/v1/notifications", json=BODY, headers=headers)
        assert replay.headers["idempotent-replayed"] == "true"
        wrong = httpx.get(f"{base}/v1/notifications", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert "kirim_deliveries" in httpx.get(f"{base}/metrics").text
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert f"url=http://127.0.0.1:{port}" in err
    assert "event=http_request" in err
    assert "client=ci" in err
    assert secret not in err + out
    assert "nope" not in err
    status = kirim(ready, "status", "cli-1", "--json")
    assert json.loads(status.stdout)["id"] == first.json()["id"]


def test_init_migrates_a_version_1_database(folder: Path) -> None:
    """A database of schema version 1, with deliveries, gains the tokens and requests."""
    from kirim.store.sqlfiles import migrations
    from kirim.store.sqlite import _statements

    path = folder / "k.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE kirim_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        for statement in _statements(dict(migrations("sqlite"))[1]):
            conn.execute(statement)
        conn.execute("INSERT INTO kirim_meta VALUES ('schema_version', '1')")
    refused = kirim(folder, "token", "list")
    assert refused.exit_code == 2
    assert "kirim init" in refused.stderr
    assert kirim(folder, "init").stdout.startswith(f"schema version {SCHEMA_VERSION} ")
    assert kirim(folder, "token", "create", "--name", "after-upgrade").exit_code == 0


def test_a_sigterm_before_uvicorn_takes_the_signals_still_stops_the_server() -> None:
    """A SIGTERM that arrives once `kirim serve` said serving but before uvicorn put in
    its own handlers (systemd stopping a unit that has just started) stops the server,
    instead of being noted and the server left running until SIGKILL."""
    import socket
    import threading

    import uvicorn

    from kirim.cli.serve import _run

    class Early(uvicorn.Server):
        def run(self, sockets: list[socket.socket] | None = None) -> None:
            signal.raise_signal(signal.SIGTERM)  # in the window before capture_signals
            super().run(sockets)

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        raise AssertionError("no request is made")

    server = Early(uvicorn.Config(app, lifespan="off", log_config=None, log_level="warning"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    stopped_by_watchdog: list[bool] = []

    def watchdog() -> None:
        stopped_by_watchdog.append(True)
        server.should_exit = True

    timer = threading.Timer(20, watchdog)  # a bound, so that the failure is not a hang
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    timer.start()
    try:
        received = _run(server, sock)
    finally:
        timer.cancel()
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert received == [signal.SIGTERM]
    assert not stopped_by_watchdog, "the SIGTERM was swallowed: the server ran on"
