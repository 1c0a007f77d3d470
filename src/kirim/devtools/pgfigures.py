"""What a ``kirim bench`` run cost the PostgreSQL server: WAL, HOT updates and CPU.

``snapshot`` reads, on the bench's throw-away database, the server's WAL position and
the update counters of kirim's three hot tables, and, when the server runs on this
host, the CPU time its processes have used; ``figures`` turns two snapshots (before
and after the deliveries) into WAL bytes per delivery, the share of updates that were
HOT (heap-only: no index entry written) per table, and the server's CPU per delivery.

The server's CPU is read from ``/proc`` (Linux): the snapshot's own session names its
backend (``pg_backend_pid()``), which is taken for this server's only when this host
has a process of that number whose command line names the throw-away database (a
server elsewhere, or in a container with its own process numbers, is not measured:
the figure is then None and ``server_cpu_scope`` says why). Its parent is the
postmaster: the CPU is the postmaster's own, that of its children still running, and
that of those it has reaped (the sessions that ended, ``cutime`` and ``cstime``). A
worker of kirim and the server share the host's CPUs, so on a small machine their
sum, not either alone, bounds the rate.

The WAL position is the server's: on a server that others use, the WAL bytes include
theirs. The table counters are this database's own. A backend flushes its counters
when it goes idle (at most once a second) and when it exits, before it leaves
``pg_stat_activity``; so ``snapshot`` first waits until no other session is connected
to the database (the workers have closed theirs), then reads.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLES = ("kirim_deliveries", "kirim_jobs", "kirim_attempts")


@dataclass(frozen=True)
class Snapshot:
    """The server's WAL position (bytes), per table (updates, HOT updates), and the CPU
    seconds the server's processes have used (None: not on this host, ``cpu_why``)."""

    wal: int
    updates: dict[str, tuple[int, int]]
    cpu: float | None = None
    cpu_why: str | None = None


#: /proc/<pid>/stat's fields after the command name: state is 0, ppid 1, utime 11,
#: stime 12, cutime 13, cstime 14 (proc(5) numbers them from 1, with pid and comm)
_PPID, _UTIME, _STIME, _CUTIME, _CSTIME = 1, 11, 12, 13, 14


def _stat(pid: int, proc: Path) -> list[str] | None:
    """The fields of ``pid``'s stat after its command name (None: no such process)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def server_cpu(backend: int, database: str, proc: Path = Path("/proc")) -> tuple[float | None, str]:
    """The CPU seconds used so far by the server whose backend is ``backend`` (the
    caller's own session, connected to ``database``), and the scope of the figure; or
    None and why it cannot be read here (the module docstring says how)."""
    try:
        command = (proc / str(backend) / "cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        command = b""  # no such process here
    if not command.startswith(b"postgres") or database.encode() not in command:
        return None, "not measured: the server's processes are not visible on this host"
    fields = _stat(backend, proc)
    if fields is None:
        return None, "not measured: the server's session ended while it was read"
    postmaster = int(fields[_PPID])
    own = _stat(postmaster, proc)
    if own is None:
        return None, "not measured: the server's main process could not be read"
    ticks = int(own[_UTIME]) + int(own[_STIME]) + int(own[_CUTIME]) + int(own[_CSTIME])
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        child = _stat(int(entry.name), proc)
        if child is not None and int(child[_PPID]) == postmaster:
            ticks += int(child[_UTIME]) + int(child[_STIME])
    scope = (
        "server-wide: every process of the server on this host, other databases' sessions included"
    )
    return ticks / os.sysconf("SC_CLK_TCK"), scope


def _wait_alone(conn: Any, timeout: float) -> None:
    """Until no other session is connected to this database (or ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
        if row is None or row[0] == 0:
            return
        time.sleep(0.05)


def snapshot(url: str, timeout: float = 10.0) -> Snapshot:
    """The WAL position and the update counters of ``TABLES``, once every other
    session of the database has gone (their counters flushed)."""
    import psycopg

    from kirim.store.postgres import postgres_conninfo

    conninfo, _ = postgres_conninfo(url)
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
        _wait_alone(conn, timeout)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = conn.execute(
            "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relname = ANY(%s)",
            [list(TABLES)],
        ).fetchall()
        wal = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')").fetchone()
        who = conn.execute("SELECT pg_backend_pid(), current_database()").fetchone()
        cpu, why = server_cpu(int(who[0]), str(who[1])) if who else (None, "not measured")
    updates = {str(name): (int(upd), int(hot)) for name, upd, hot in rows}
    return Snapshot(wal=int(wal[0]) if wal else 0, updates=updates, cpu=cpu, cpu_why=why)


def figures(before: Snapshot, after: Snapshot, delivered: int) -> dict[str, Any]:
    """WAL bytes per delivery (server-wide) and, per table, the updates per delivery
    made between the snapshots and the share of them that were HOT (None where there
    were none): flat keys, ``hot_ratio_kirim_jobs`` and the like."""
    out: dict[str, Any] = {
        "wal_bytes_per_delivery": round((after.wal - before.wal) / delivered, 1)
        if delivered
        else None,
        "wal_scope": "server-wide: other databases' writes on the server count too",
        "server_cpu_us_per_delivery": (
            round((after.cpu - before.cpu) / delivered * 1e6, 1)
            if delivered and before.cpu is not None and after.cpu is not None
            else None
        ),
        "server_cpu_scope": after.cpu_why if after.cpu is None else before.cpu_why,
    }
    for table in TABLES:
        upd0, hot0 = before.updates.get(table, (0, 0))
        upd1, hot1 = after.updates.get(table, (0, 0))
        made = upd1 - upd0
        out[f"updates_per_delivery_{table}"] = round(made / delivered, 2) if delivered else None
        out[f"hot_ratio_{table}"] = round((hot1 - hot0) / made, 3) if made > 0 else None
    return out
