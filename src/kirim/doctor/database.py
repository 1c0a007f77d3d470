"""``kirim doctor``'s checks of what sits under the store: what a commit is worth.

kirim's promise holds for what the database keeps. These checks name what this one
keeps and where a committed intent could still be lost:

- ``replication`` (PostgreSQL): ``synchronous_commit``, ``synchronous_standby_names``
  and the standbys streaming now: synchronous (a failover loses no acknowledged
  commit), asynchronous (a failover loses the commits not yet streamed), or none;
  ``synchronous_commit = off`` and ``fsync = off`` (a crash loses the last commits);
  a standby in recovery; a promoted server (timeline above 1);
- ``pooler`` (PostgreSQL): a pooler or proxy in front (``kirim.store.pooler``), and
  where the workers LISTEN (``listen_url``);
- ``ledger_behind`` (PostgreSQL): what workers found missing after a lost connection
  (``kirim.store.postgres.ledger``);
- ``durability`` (SQLite): the ``synchronous`` setting of the database URL.

Figures behind the wording: docs/operations.md.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

from kirim.config import Config
from kirim.doctor.audit import OK, PROBLEM, SKIPPED, WARNING, Check, plural
from kirim.doctor.probes import Database
from kirim.errors import KirimError, StoreError

OPERATIONS = "docs/operations.md"
#: the synchronous_commit values that make a commit wait for a synchronous standby
WAITS = ("on", "remote_apply", "remote_write")


def database_checks(db: Database, config: Config, *, has_schema: bool) -> list[Check]:
    """The checks of the database under a kirim store (``db`` open)."""
    if db.dialect == "sqlite":
        return [_sqlite(db.url)]
    checks = [_replication(db), _pooler(db, config)]
    if has_schema:
        checks.append(_ledger_behind(db))
    return checks


# -- SQLite ----------------------------------------------------------------------------


def _sqlite(url: str) -> Check:
    """The ``synchronous`` setting the URL gives the store (the file does not keep it)."""
    from kirim.store.sqlite import sqlite_path

    setting = sqlite_path(url)[1].get("synchronous", "full").lower()
    if setting in ("full", "extra"):
        return Check(
            "durability",
            OK,
            f"synchronous={setting}: every commit is on disk before it returns; a power "
            "loss loses no committed intent",
        )
    return Check(
        "durability",
        WARNING,
        f"synchronous={setting}: commits return before the write-ahead log reaches the "
        "disk; a power loss (not a crash of the process) can undo the last commits, a "
        f"committed intent with them, and its request may be sent again ({OPERATIONS})",
        "drop ?synchronous= from the database URL (the store's default is full)",
    )


# -- PostgreSQL: replication -----------------------------------------------------------


def _rows(db: Database, name: str) -> list[dict[str, Any]] | None:
    with contextlib.suppress(StoreError):
        return db.named(name)
    return None


def _replication(db: Database) -> Check:
    found = _rows(db, "doctor_durability")
    if not found:
        return Check("replication", SKIPPED, "the server would not say its settings")
    s = found[0]
    commit, names, fsync = s["synchronous_commit"], s["standby_names"].strip(), s["fsync"]
    standbys = _rows(db, "doctor_standbys") or []
    timeline = None
    with contextlib.suppress(StoreError, TypeError, ValueError):
        timeline = int(db.named_scalar("doctor_timeline"))
    settings = f"synchronous_commit={commit}, synchronous_standby_names='{names}'"
    seen = _standbys(standbys)
    promoted = (
        f"; this server was promoted (timeline {timeline})" if timeline and timeline > 1 else ""
    )
    if s["in_recovery"]:
        return Check(
            "replication",
            PROBLEM,
            "this server is a standby in recovery: it takes no writes",
            "point kirim at the primary: a multi-host URL (host=a,b) with "
            "target_session_attrs=read-write follows it through a failover",
        )
    risks = []
    if commit == "off":
        risks.append(
            "synchronous_commit=off: commits return before they are flushed, so a crash "
            "of the server loses the last ones (up to three wal_writer_delay), and a "
            "failover loses them too"
        )
    if fsync == "off":
        risks.append("fsync=off: a crash of the server's host can lose or corrupt commits")
    sync = [r for r in standbys if r.get("sync_state") in ("sync", "quorum")]
    if names and commit in WAITS:
        if sync:
            mode = "synchronous replication"
            if commit == "remote_write":
                mode += " (remote_write: the standby has written, not yet flushed, a commit)"
            detail = f"{mode}, {settings}; standbys: {seen}: a failover to a synchronous "
            detail += "standby loses no acknowledged commit"
        elif standbys and all(r.get("sync_state") is None for r in standbys):
            detail = f"synchronous replication configured ({settings}); standbys: {seen}"
        else:
            return Check(
                "replication",
                WARNING,
                f"{settings}, but no synchronous standby is streaming (standbys: {seen}): "
                "commits wait until one is back (writes hang)" + promoted,
                "bring the standby back, or change synchronous_standby_names",
            )
    elif standbys:
        risks.append(
            f"asynchronous replication ({settings}; standbys: {seen}): a failover loses "
            "the commits not yet streamed, a committed intent with them, and its request "
            f"may be sent again ({OPERATIONS})"
        )
        detail = ""
    else:
        detail = (
            f"no standby streams from this server ({settings}): commits are durable here; "
            "a failover by other means (a managed service's) keeps what that one keeps"
        )
    if risks:
        return Check(
            "replication",
            WARNING,
            "; ".join(risks) + promoted,
            "synchronous_commit = on and synchronous_standby_names = 'FIRST 1 (standby)' "
            "(a synchronous standby), fsync = on",
        )
    return Check("replication", OK, detail + promoted)


def _standbys(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "none streaming"
    return ", ".join(
        f"{r['name'] or '?'} ({r.get('sync_state') or 'state hidden: needs pg_monitor'})"
        for r in rows
    )


# -- PostgreSQL: a pooler in front -----------------------------------------------------


def _pooler(db: Database, config: Config) -> Check:
    found = db.route()
    if found is None or found.in_front is None:
        why = "the server would not say" if found is None else "a Unix socket on both sides"
        return Check("pooler", SKIPPED, f"cannot tell whether a pooler is in front ({why})")
    if not found.in_front:
        return Check("pooler", OK, f"a direct connection ({found.describe()})")
    front = (
        f"a pooler or proxy sits in front ({found.describe()}); kirim keeps nothing in a "
        "session, so its transactions work through PgBouncer in transaction mode"
    )
    poll = f"every {config.worker.poll_interval:g} s"
    if config.listen_url is None:
        return Check(
            "pooler",
            WARNING,
            f"{front}, but LISTEN does not: through a pooler in transaction mode no wake-up "
            f"reaches the workers, which find new work only by polling ({poll})",
            'set listen_url = "postgresql://…" (a direct connection to the server) in the '
            "config, or KIRIM_LISTEN_URL",
        )
    listen = None
    with contextlib.suppress(KirimError), Database(config.listen_url) as direct:
        listen = direct.route()
    if listen is not None and listen.in_front is False:
        return Check("pooler", OK, f"{front}; the workers LISTEN on listen_url, a direct one")
    return Check(
        "pooler",
        WARNING,
        f"{front}; listen_url "
        + ("cannot be reached" if listen is None else "goes through one too")
        + f": idle workers may only poll ({poll})",
        "point listen_url at the server itself, not at the pooler",
    )


# -- PostgreSQL: the ledger behind what workers committed ------------------------------


def _ledger_behind(db: Database) -> Check:
    notes = _rows(db, "doctor_ledger_behind")
    if notes is None:
        return Check("ledger_behind", SKIPPED, "could not read the workers' notes")
    if not notes:
        return Check("ledger_behind", OK, "no worker found an intent it had committed missing")
    missing, requests, deliveries = 0, [], []
    for note in notes:
        with contextlib.suppress(ValueError, TypeError, KeyError):
            data = json.loads(note["value"])
            missing += int(data["missing"])
            requests += data.get("provider_request_ids", [])
            deliveries += data.get("delivery_ids", [])
    return Check(
        "ledger_behind",
        PROBLEM,
        f"{plural(missing, 'intent')} committed by workers vanished from the database "
        f"({plural(len(notes), 'note')}: requests {', '.join(requests[:5]) or '?'}; "
        f"deliveries {', '.join(str(d) for d in deliveries[:5]) or '?'}): the database "
        "lost commits it had acknowledged (a failover to an asynchronous standby, or "
        "synchronous_commit=off and a crash); those requests may have reached the "
        "provider and may have been sent again",
        "ask the provider or the recipients about those deliveries (`kirim status ID`), "
        "make replication synchronous (see the replication check), then clear the notes: "
        "DELETE FROM kirim_meta WHERE key LIKE 'ledger_behind:%'",
    )
