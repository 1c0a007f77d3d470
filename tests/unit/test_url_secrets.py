"""Secrets in URLs: a password or key given as a query parameter is redacted wherever a
URL is printed (errors, ``kirim doctor``, ``kirim serve``'s log, the worker's banner),
and a libpq URI is read as libpq reads it (``postgresql:///db?host=...&user=...``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from kirim.store.postgres import postgres_conninfo
from kirim.text import redact_url

SECRET = "s3cret-pw-61f0a9"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://postgres@127.0.0.1/db?password={SECRET}",
        f"postgresql:///db?host=127.0.0.1&user=postgres&password={SECRET}&sslmode=prefer",
        f"postgresql://u:{SECRET}@h/db?sslpassword={SECRET}",
        f"https://hooks.example.com/x?api_key={SECRET}&channel=1",
        f"https://hooks.example.com/x?token={SECRET}",
        f"https://hooks.example.com/x?access_token={SECRET}#top",
        f"https://hooks.example.com/x?sig={SECRET}&key={SECRET}",
    ],
)
def test_every_secret_looking_parameter_is_redacted(url: str) -> None:
    """The value of password, api_key, token, key, sig... is ***; the rest is kept."""
    shown = redact_url(url)
    assert SECRET not in shown
    assert "***" in shown
    assert shown.split("?")[0].split("@")[-1] == url.split("?")[0].split("@")[-1]
    if "sslmode=prefer" in url:
        assert "sslmode=prefer" in shown
    if "channel=1" in url:
        assert "channel=1" in shown


def test_a_libpq_uri_is_read_as_libpq_reads_it() -> None:
    """An empty authority keeps its //, and parameters are percent-decoded only (a + is
    a plus): postgresql:///db?host=... was rebuilt as postgresql:/db and refused."""
    url = "postgresql:///kirim?host=/run/postgresql&user=postgres&password=a+b%20c&pool_max_size=3"
    conninfo, pool = postgres_conninfo(url)
    assert conninfo.startswith("postgresql:///kirim?")
    assert conninfo_to_dict(conninfo) == {
        "dbname": "kirim",
        "host": "/run/postgresql",
        "user": "postgres",
        "password": "a+b c",
    }
    assert pool["pool_max_size"] == 3


def kirim(*args: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KIRIM_DATABASE_URL"}
    head = [sys.executable, "-m", "kirim"] + (["--config", str(config)] if config else [])
    return subprocess.run(
        [*head, *args], capture_output=True, text=True, timeout=60, check=False, env=env
    )


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://postgres@127.0.0.1:1/nodb?password={SECRET}&connect_timeout=2",
        f"postgresql://postgres@127.0.0.1:1/nodb?password={SECRET}&sslmode=%zz",
        f"mysql://root:{SECRET}@127.0.0.1/db?password={SECRET}",
    ],
)
def test_no_command_prints_a_password_parameter(url: str) -> None:
    """doctor, init, status and list on a database they cannot reach say so, without
    the password (it was printed in full)."""
    for args in (["doctor"], ["init"], ["status", "1"], ["list"]):
        done = kirim("--database", url, *args)
        assert done.returncode != 0
        assert SECRET not in done.stdout + done.stderr, (args, done.stderr)
        assert done.stderr.strip()


@pytest.mark.slow
def test_serve_and_the_worker_banner_print_no_secret(tmp_path: Path) -> None:
    """kirim serve's 'serving' line (its database URL with ?password=) and the worker's
    banner (a webhook URL with ?api_key=) show *** instead."""
    db = f"sqlite:///{tmp_path / 'k.db'}?password={SECRET}"
    config = tmp_path / "kirim.toml"
    config.write_text(
        f'database = "{db}"\n[channels.hook]\nurl = "http://127.0.0.1:9/x?api_key={SECRET}"\n'
    )
    assert kirim("init", config=config).returncode == 0
    worker = kirim("worker", "--burst", config=config)
    assert worker.returncode == 0, worker.stderr
    assert "api_key=***" in worker.stderr
    assert SECRET not in worker.stderr + worker.stdout
    env = {k: v for k, v in os.environ.items() if k != "KIRIM_DATABASE_URL"}
    serve = subprocess.Popen(
        [sys.executable, "-m", "kirim", "--config", str(config), "serve", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert serve.stderr is not None
        line = ""
        for line in serve.stderr:  # the line that says where it serves
            if "event=serving" in line:
                break
        assert "event=serving" in line
    finally:
        serve.send_signal(signal.SIGTERM)
        rest = serve.communicate(timeout=30)[1]
    assert SECRET not in line + rest
    assert "password=***" in line


def test_a_libpq_uri_without_an_authority_opens(request: pytest.FixtureRequest) -> None:
    """postgresql:///DB?host=127.0.0.1&user=postgres (psql takes it) opens a store
    and records a notification (it was rebuilt as postgresql:/DB and refused)."""
    import asyncio
    from urllib.parse import urlsplit

    from kirim.config import Config
    from kirim.engine import Kirim
    from pg import fresh_database

    parts = urlsplit(fresh_database(request))
    url = f"postgresql:///{parts.path.lstrip('/')}?host={parts.hostname}&port={parts.port}"
    url += f"&user={parts.username}"

    async def run() -> int:
        kirim = Kirim(Config(database=url, channels={}))
        await kirim.open(migrate=True)
        try:
            return len((await kirim.records(limit=1)).records)
        finally:
            await kirim.close()

    assert asyncio.run(run()) == 0
