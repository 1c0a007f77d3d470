"""PgBouncer in transaction pooling mode, in front of a test PostgreSQL server.

Debian's ``pgbouncer`` (``make test`` installs it; its system service stays disabled):
each ``Bouncer`` runs its own instance from a config in a temporary folder, on a free
port of 127.0.0.1, as the ``postgres`` OS user when we are root (PgBouncer refuses to
run as root), with ``pool_mode = transaction`` and one wildcard entry that sends
every database name to the server behind it. Consecutive transactions of one client
connection may run on different server connections, and one server connection
serves many clients: what a client leaves in a session (a prepared statement, a
``SET``, a ``LISTEN``) is not there for its next transaction, and is there for
someone else's.

- ``pooled_url(url, bouncer)``: the same database, reached through the pooler;
- ``shared_bouncer(request)``: one instance for the session, in front of the shared
  server of ``tests/pg.py`` (the ``database_url`` fixture's ``pgbouncer`` backend);
- ``bouncer(request, server_port, pool_size=…)``: one of its own for a test, stopped
  at the end.

Without the binary the tests are skipped with one loud line; with ``CI`` set they
fail instead.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from pg import ADMIN_URL, require_or_skip
from pgserver import free_port

#: the backends of a module whose tests also run through the pooler:
#: ``pytestmark = pytest.mark.parametrize("database_url", POOLED, indirect=True)``
POOLED = ["sqlite", "postgres", "pgbouncer"]


def find_pgbouncer() -> str | None:
    return shutil.which("pgbouncer") or next(
        (str(p) for p in (Path("/usr/sbin/pgbouncer"), Path("/usr/bin/pgbouncer")) if p.exists()),
        None,
    )


def unavailable() -> str | None:
    """Why no PgBouncer can be started here (None: it can)."""
    if find_pgbouncer() is None:
        return "no pgbouncer binary (apt-get install --no-install-recommends pgbouncer)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no `postgres` OS user to run pgbouncer as"
        if shutil.which("runuser") is None:
            return "running as root without `runuser`"
    return None


class Bouncer:
    """One PgBouncer (transaction pooling) in front of ``host:port``; ``start``,
    ``stop``, ``url(database)``."""

    def __init__(self, *, host: str, port: int, pool_size: int = 20) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="kirim-pgbouncer-"))
        self.port = free_port()
        self.user = "postgres" if os.geteuid() == 0 else None
        self.log = self.root / "pgbouncer.log"
        self.pidfile = self.root / "pgbouncer.pid"
        (self.root / "users.txt").write_text('"postgres" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.root / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\nmax_client_conn = 400\n"
            f"logfile = {self.log}\npidfile = {self.pidfile}\n"
            "admin_users = postgres\n"
            # psycopg and libpq may send these; PgBouncer would refuse the connection
            "ignore_startup_parameters = extra_float_digits,options\n"
            "server_login_retry = 1\n"
        )
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            for path in (self.root, *self.root.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)

    def start(self) -> None:
        binary = find_pgbouncer()
        assert binary is not None
        cmd = [binary, "-d", str(self.root / "pgbouncer.ini")]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"pgbouncer failed to start: {done.stderr or done.stdout}")
        self.wait_ready()

    def wait_ready(self, within: float = 15.0) -> None:
        deadline = time.monotonic() + within
        while True:
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.Error:
                if time.monotonic() > deadline:
                    tail = self.log.read_text()[-2000:] if self.log.exists() else ""
                    why = f"pgbouncer does not answer on {self.port}\n{tail}"
                    raise RuntimeError(why) from None
                time.sleep(0.1)

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        """SIGTERM the daemon (by the pid it wrote) and remove its folder; never raises."""
        with contextlib.suppress(Exception):
            pid = int(self.pidfile.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                os.kill(pid, 0)
                time.sleep(0.05)
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


def pooled_url(url: str, bouncer: Bouncer) -> str:
    """``url``'s database, through ``bouncer`` (the query string kept)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"postgres@127.0.0.1:{bouncer.port}"))


def bouncer(request: pytest.FixtureRequest, server_port: int, *, pool_size: int = 20) -> Bouncer:
    """A started PgBouncer of this test alone in front of 127.0.0.1:``server_port``."""
    require_or_skip(
        request, unavailable(), needs="PgBouncer", tests="PgBouncer", missing="PgBouncer"
    )
    started = Bouncer(host="127.0.0.1", port=server_port, pool_size=pool_size)
    request.addfinalizer(started.stop)
    started.start()
    return started


class _Shared:
    bouncer: Bouncer | None = None


def shared_bouncer(request: pytest.FixtureRequest) -> Bouncer:
    """One PgBouncer for the whole session, in front of the shared server of ``pg.py``."""
    require_or_skip(
        request, unavailable(), needs="PgBouncer", tests="PgBouncer", missing="PgBouncer"
    )
    if _Shared.bouncer is None:
        parts = urlsplit(ADMIN_URL)
        started = Bouncer(host=parts.hostname or "127.0.0.1", port=parts.port or 5432, pool_size=2)

        def cleanup() -> None:
            started.stop()
            _Shared.bouncer = None

        request.config.add_cleanup(cleanup)
        started.start()
        _Shared.bouncer = started
    return _Shared.bouncer
