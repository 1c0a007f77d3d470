"""Throw-away PostgreSQL databases for the test suite, on the local server.

- ``python tests/pg.py ensure`` starts the local server if it does not answer (run by
  ``make test``); it fails only when ``CI`` is set and the server cannot be reached.
- ``template_database()`` (session): creates ``kirim_test_<hex>``, yields its URL,
  drops it at the end (started on the first PostgreSQL test, ended with the session).
- ``fresh_database(request)`` (per test): an empty database of its own, copied from
  that template with ``CREATE DATABASE … TEMPLATE``. A background thread keeps the
  next ones ready and recycles used ones (connections ended, schema dropped), so a
  test waits for neither; all are dropped at the end of the session.

Without a server the PostgreSQL tests are skipped, with one loud line saying why;
with ``CI`` set they fail instead. ``KIRIM_TEST_PG`` overrides the server's admin URL
(default ``postgresql://postgres@127.0.0.1:5432/postgres``).
"""

from __future__ import annotations

import os
import queue
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

ADMIN_URL = os.environ.get("KIRIM_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
PREFIX = "kirim_test_"
READY = 2  # databases kept ready ahead of the tests


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def database_url(name: str) -> str:
    parts = urlsplit(ADMIN_URL)
    return urlunsplit(parts._replace(path=f"/{name}"))


def reachable(timeout: float = 3.0) -> str | None:
    """None when the server answers; otherwise why not."""
    try:
        with psycopg.connect(ADMIN_URL, connect_timeout=max(1, int(timeout))) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def start_server() -> str | None:
    """Start the local cluster with pg_ctlcluster; None on success, else why not."""
    tool = shutil.which("pg_ctlcluster")
    versions = sorted(Path("/etc/postgresql").glob("*/main")) if tool else []
    if not versions:
        return "pg_ctlcluster or /etc/postgresql/<version>/main not found"
    version = versions[-1].parent.name
    try:
        done = subprocess.run(
            [tool or "pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"pg_ctlcluster failed: {exc}"
    if done.returncode != 0:  # 2: already running (then waiting would not help)
        return f"pg_ctlcluster: {(done.stderr or done.stdout).strip()}"
    return None


def ensure(wait: float = 15.0) -> str | None:
    """Make the server answer (starting it if needed); None when it does, else why not."""
    why = reachable()
    if why is None:
        return None
    failed = start_server()
    deadline = time.monotonic() + (0 if failed else wait)
    while time.monotonic() < deadline:
        why = reachable()
        if why is None:
            return None
        time.sleep(0.3)
    return f"PostgreSQL at {ADMIN_URL} is not reachable: {why}" + (f" ({failed})" if failed else "")


def _admin() -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(ADMIN_URL, autocommit=True)


def _drop(conn: psycopg.Connection[tuple[object, ...]], name: str) -> None:
    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class _Factory:
    """Keeps empty databases ready: copies of the template at first, then used ones
    recycled (their connections ended, their schema dropped and made anew), which
    is several times faster than CREATE DATABASE and just as empty."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.ready: queue.Queue[str | BaseException] = queue.Queue()
        self.todo: queue.Queue[str | None] = queue.Queue()  # a name to recycle; None: create
        self.count = 0
        self.recycling = 0  # used databases given back and not yet ready again
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._work, name="kirim-pg-dbs", daemon=True)
        self.thread.start()
        for _ in range(READY):
            self.todo.put(None)

    def _work(self) -> None:
        with _admin() as conn:
            while True:
                job = self.todo.get()
                if job == "":  # stop
                    return
                try:
                    self.ready.put(self._create(conn) if job is None else self._recycle(conn, job))
                except psycopg.Error as exc:
                    self.ready.put(exc)
                if job is not None:
                    with self.lock:
                        self.recycling -= 1

    def _create(self, conn: psycopg.Connection[tuple[object, ...]]) -> str:
        self.count += 1
        name = f"{self.template}_{self.count}"
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return name

    def _recycle(self, conn: psycopg.Connection[tuple[object, ...]], name: str) -> str:
        try:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            with psycopg.connect(database_url(name), autocommit=True) as db:
                schemas = db.execute(
                    "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' "
                    "AND nspname <> 'information_schema'"
                ).fetchall()
                for (schema,) in schemas:
                    db.execute(f'DROP SCHEMA "{schema}" CASCADE')
                db.execute("CREATE SCHEMA public")
        except psycopg.Error:
            _drop(conn, name)
            return self._create(conn)
        return name

    def take(self) -> str:
        with self.lock:
            if self.ready.empty() and not self.recycling:
                self.todo.put(None)
        got = self.ready.get(timeout=60)
        if isinstance(got, BaseException):
            raise got
        return got

    def give_back(self, name: str) -> None:
        with self.lock:
            self.recycling += 1
        self.todo.put(name)

    def close(self) -> None:
        self.todo.put("")
        self.thread.join(timeout=60)
        with _admin() as conn:
            # Every database of this session (ready, used, left by a failed test).
            names = conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s",
                (self.template.replace("_", r"\_") + r"\_%",),
            ).fetchall()
            for (name,) in names:
                _drop(conn, str(name))


def template_database() -> Iterator[str]:
    """Session scope: create ``kirim_test_<hex>``, yield its URL, drop it at the end."""
    name = PREFIX + secrets.token_hex(4)
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url(name)
    finally:
        with _admin() as conn:
            _drop(conn, name)


class _Session:
    """The per-session state behind ``fresh_database``."""

    unavailable: str | None = None
    checked = False
    factory: _Factory | None = None


_said: set[tuple[str, str]] = set()


def require_or_skip(
    request: pytest.FixtureRequest, why: str | None, *, needs: str, tests: str, missing: str
) -> None:
    """Go on when ``why`` is None (what the test needs can be had here); else fail the
    test when ``CI`` is set (``needs`` is required there), or skip it, saying aloud once
    per reason that the ``tests`` tests are skipped."""
    if why is None:
        return
    if in_ci():
        pytest.fail(f"CI is set and {needs} is required: {why}")
    if (tests, why) not in _said:
        _said.add((tests, why))
        _loud(request.config, f"{tests} tests SKIPPED: {why}")
    pytest.skip(f"no {missing}: {why}")


def _loud(config: pytest.Config, line: str) -> None:
    """One line on the terminal, even while output is captured."""
    capman = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if capman is None or reporter is None:
        print(line, file=sys.stderr)
        return
    with capman.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line(line, yellow=True, bold=True)


def _factory(config: pytest.Config) -> _Factory:
    if not _Session.checked:
        _Session.checked = True
        why = ensure()
        if why is not None:
            _Session.unavailable = why
            if not in_ci():
                _loud(config, f"PostgreSQL tests SKIPPED: {why}")
    if _Session.unavailable is not None:
        if in_ci():
            pytest.fail(f"CI is set and PostgreSQL is required: {_Session.unavailable}")
        pytest.skip(f"no PostgreSQL at {ADMIN_URL} (the reason is printed above)")
    if _Session.factory is None:
        session = template_database()
        template = urlsplit(next(session)).path.lstrip("/")
        factory = _Factory(template)
        _Session.factory = factory

        def cleanup() -> None:
            factory.close()
            next(session, None)
            _Session.factory = None

        config.add_cleanup(cleanup)
    return _Session.factory


def fresh_database(request: pytest.FixtureRequest) -> str:
    """An empty database for this test alone (recycled after it); skips, or fails in CI,
    when there is no server."""
    factory = _factory(request.config)
    name = factory.take()
    request.addfinalizer(lambda: factory.give_back(name))
    return database_url(name)


def main(argv: list[str]) -> int:
    if argv[1:] != ["ensure"]:
        print("usage: python tests/pg.py ensure", file=sys.stderr)
        return 2
    why = ensure()
    if why is None:
        print(f"PostgreSQL is up at {ADMIN_URL}")
        return 0
    if in_ci():
        print(f"ERROR: CI is set and {why}", file=sys.stderr)
        return 1
    print(f"WARNING: {why}; the PostgreSQL tests will be skipped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
