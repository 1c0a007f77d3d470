"""A private, throw-away PostgreSQL server for the tests that stop and restart one.

The shared server of ``tests/pg.py`` is never stopped: fault tests run their own
cluster here, made by ``initdb`` in a temporary folder (the newest
``/usr/lib/postgresql/<version>/bin``, or ``KIRIM_PG_BINDIR``), on a free port of
127.0.0.1 with trust authentication, run as the ``postgres`` OS user when we are
root (PostgreSQL refuses to run as root). ``private_server(request)`` is the
fixture's body: it yields a started server and always stops it and removes its
folder at the end. Without the binaries (or that user) the tests are skipped with
one loud line; with ``CI`` set they fail instead.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import psycopg
import pytest

from pg import require_or_skip

# Durability is not under test (the OS does not crash): skip every fsync.
SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "on",
    "full_page_writes": "off",
    "max_connections": "100",
    "shared_buffers": "32MB",
    "log_min_messages": "warning",
}


def find_bindir() -> Path | None:
    """The newest PostgreSQL server binaries on this host."""
    override = os.environ.get("KIRIM_PG_BINDIR")
    if override:
        return Path(override) if (Path(override) / "initdb").exists() else None
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if found:
        return found[-1].parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateServer:
    """One cluster in its own folder: ``start``, ``stop``, ``restart``, ``url(db)``."""

    def __init__(self, bindir: Path, *, user: str | None) -> None:
        self.bindir = bindir
        self.user = user  # OS user to run as (None: ourselves)
        self.root = Path(tempfile.mkdtemp(prefix="kirim-pgserver-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=self.root
        )

    def _check(self, *args: str, timeout: float = 60) -> None:
        done = self._run(*args, timeout=timeout)
        if done.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{' '.join(args[:2])} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()}\n{tail}"
            )

    def init(self, settings: Mapping[str, str] | None = None) -> None:
        """``initdb``, and ``SETTINGS`` with ``settings`` over them in its config."""
        self._check(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
            "--no-sync", "--no-instructions",
        )  # fmt: skip
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n")
            conf.write(f"unix_socket_directories = '{self.root}'\n")
            for key, value in {**SETTINGS, **(settings or {})}.items():
                conf.write(f"{key} = '{value}'\n")

    def start(self) -> None:
        self._check("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """``fast`` ends sessions cleanly; ``immediate`` is a crash (recovery at start)."""
        self._check("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    @property
    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status").returncode == 0

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def wait_ready(self, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.Error:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def destroy(self) -> None:
        """Stop (as a crash: nothing to keep) and remove the folder; never raises."""
        with contextlib.suppress(Exception):
            if self.data.exists() and self.running:
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def unavailable() -> str | None:
    """Why no private server can be made here (None: it can)."""
    bindir = find_bindir()
    if bindir is None:
        return "no initdb found (install the postgresql server package)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no `postgres` OS user to run the server as"
        if shutil.which("runuser") is None:
            return "running as root without `runuser`"
    return None


def require(request: pytest.FixtureRequest) -> None:
    """Skip the test (said aloud once) when no private server can be made here; fail it
    when ``CI`` is set."""
    require_or_skip(
        request,
        unavailable(),
        needs="a private PostgreSQL server",
        tests="PostgreSQL fault",
        missing="private PostgreSQL server",
    )


@contextlib.contextmanager
def running(settings: Mapping[str, str] | None = None) -> Iterator[PrivateServer]:
    """A started private server (``settings`` over ``SETTINGS``); stopped and removed
    whatever happens. ``unavailable()`` must have said it can be made."""
    bindir = find_bindir()
    assert bindir is not None
    server = PrivateServer(bindir, user="postgres" if os.geteuid() == 0 else None)
    try:
        server.init(settings)
        server.start()
        server.wait_ready()
        yield server
    finally:
        server.destroy()


def private_server(request: pytest.FixtureRequest) -> Iterator[PrivateServer]:
    """A started private server for one test; stopped and removed whatever happens."""
    require(request)
    with running() as server:
        yield server
