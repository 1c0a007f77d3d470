"""A throw-away PostgreSQL primary with a streaming standby, for the failover tests.

Built from the same binaries as ``tests/pgserver.py`` (Debian's
``/usr/lib/postgresql/<version>/bin``): ``initdb`` makes the primary in a temporary
folder, ``pg_basebackup -X stream -R`` copies it into another one, and the standby
streams from it as ``standby1``; each listens on a free port of 127.0.0.1 and runs as
the ``postgres`` OS user when we are root. ``replication``:

- ``"sync"``: ``synchronous_standby_names = 'standby1'``, ``synchronous_commit = on``:
  a commit returns once the standby has flushed it;
- ``"async"``: no synchronous standby: a commit returns once it is on the primary;
- ``"async-off"``: asynchronous and ``synchronous_commit = off`` on the primary: a
  commit returns before it is even flushed there (so before it can be streamed).

Clients reach whichever is the primary with one multi-host URL (``url``:
``host=a,b`` and ``target_session_attrs=read-write``). ``kill_primary`` SIGKILLs the
primary's postmaster and every process of it (a host that dies); ``promote`` makes
the standby the primary. ``cluster(request, replication)`` is the fixture's body: it
always stops both and removes their folders at the end. Without the binaries the
tests are skipped with one loud line; with ``CI`` set they fail instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Literal

import psycopg
import pytest

from pg import require_or_skip
from pgserver import PrivateServer, find_bindir, unavailable

Replication = Literal["sync", "async", "async-off"]
STANDBY = "standby1"


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


class Cluster:
    """A primary and a standby streaming from it (see the module's docstring)."""

    def __init__(self, replication: Replication) -> None:
        bindir = find_bindir()
        assert bindir is not None
        user = "postgres" if os.geteuid() == 0 else None
        self.replication = replication
        self.primary = PrivateServer(bindir, user=user)
        self.standby = PrivateServer(bindir, user=user)
        self.promoted = False

    # -- making it ----------------------------------------------------------------------

    def start(self) -> None:
        p = self.primary
        p.init()
        with (p.data / "postgresql.conf").open("a") as conf:
            # durability is what these tests are about: fsync on, unlike pgserver's
            conf.write("fsync = 'on'\nfull_page_writes = 'on'\n")
            conf.write("wal_level = 'replica'\nmax_wal_senders = 5\nwal_keep_size = '64MB'\n")
            if self.replication == "sync":
                conf.write(f"synchronous_standby_names = '{STANDBY}'\nsynchronous_commit = 'on'\n")
            elif self.replication == "async-off":
                conf.write("synchronous_commit = 'off'\n")
        p.start()
        p.wait_ready()
        s = self.standby
        p._check(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(p.port), "-U", "postgres",
            "-D", str(s.data), "-X", "stream", "-R", "-c", "fast", "--no-sync",
        )  # fmt: skip
        with (s.data / "postgresql.conf").open("a") as conf:
            # its own port and socket; after a promotion it waits for no standby
            conf.write(f"\nport = {s.port}\nunix_socket_directories = '{s.root}'\n")
            conf.write("synchronous_standby_names = ''\nsynchronous_commit = 'on'\n")
        with (s.data / "postgresql.auto.conf").open("a") as auto:  # after -R's line: wins
            auto.write(
                f"primary_conninfo = 'host=127.0.0.1 port={p.port} user=postgres "
                f"application_name={STANDBY}'\n"
            )
        s.start()
        self.wait_streaming()

    def wait_streaming(self, within: float = 60.0) -> None:
        """Until the primary streams to the standby (as its synchronous one, in sync)."""
        want = "sync" if self.replication == "sync" else "async"
        deadline = time.monotonic() + within
        while True:
            with psycopg.connect(self.primary.url(), autocommit=True) as conn:
                row = conn.execute(
                    "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                    (STANDBY,),
                ).fetchone()
            if row is not None and row[0] == "streaming" and row[1] == want:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby is not streaming ({row})")
            time.sleep(0.1)

    def wait_replayed(self, within: float = 30.0) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            target = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
        assert target is not None
        deadline = time.monotonic() + within
        while True:
            with psycopg.connect(self.standby.url(), autocommit=True) as conn:
                row = conn.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target[0],)
                ).fetchone()
            if row is not None and row[0]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not catch up")
            time.sleep(0.02)

    def create_database(self, name: str) -> str:
        """A database made on the primary (streamed to the standby); its multi-host URL."""
        self.primary.create_database(name)
        self.wait_replayed()
        return self.url(name)

    def url(self, database: str = "postgres") -> str:
        """Whichever server is the primary now, as the workers connect."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return (
            f"postgresql://postgres@{hosts}/{database}"
            "?target_session_attrs=read-write&connect_timeout=2"
        )

    # -- faults -------------------------------------------------------------------------

    def _postmaster(self, server: PrivateServer) -> int:
        return int((server.data / "postmaster.pid").read_text().split()[0])

    def walsender(self) -> int:
        """The pid of the primary's process that streams to the standby."""
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            row = conn.execute(
                "SELECT pid FROM pg_stat_replication WHERE application_name = %s", (STANDBY,)
            ).fetchone()
        assert row is not None, "no walsender"
        return int(row[0])

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster and all its processes at once (as a host
        that loses power would stop them: no shutdown, no last WAL sent)."""
        pid = self._postmaster(self.primary)
        for victim in [pid, *_children(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)

    def promote(self) -> None:
        """The standby ends recovery and takes writes."""
        self.standby._check("pg_ctl", "-D", str(self.standby.data), "promote", "-w", "-t", "60")
        self.promoted = True

    def destroy(self) -> None:
        """Stop both (as a crash: nothing to keep) and remove their folders; never raises."""
        for server in (self.primary, self.standby):
            with contextlib.suppress(Exception):
                pid = self._postmaster(server)
                for victim in [pid, *_children(pid)]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(victim, signal.SIGCONT)
                        os.kill(victim, signal.SIGKILL)
            server.destroy()


def cluster(request: pytest.FixtureRequest, replication: Replication) -> Cluster:
    """A started primary + standby for one test; both stopped and removed at the end."""
    require_or_skip(
        request,
        unavailable(),
        needs="a primary with a standby",
        tests="PostgreSQL failover",
        missing="private PostgreSQL servers",
    )
    made = Cluster(replication)
    request.addfinalizer(made.destroy)
    try:
        made.start()
    except (RuntimeError, subprocess.SubprocessError) as exc:
        pytest.fail(f"could not make a primary with a standby: {exc}")
    return made
